"""The Secrets that secure the federated and parameter-server channels, and how pods mount them.

Pure builders (no API calls). Two Secrets per job, both minted here and created by the
reconciler under a fresh random name (`fresh_secret_name`), never read back, never
replaced in place (a new CA or key would cut off running clients). The operator may not
read Secrets, so it cannot tell its own from one someone else created under the name it
wanted: a name anyone could predict (the job's UID is public) would let whoever may
create Secrets in the namespace plant a key they know. So a Secret counts as the job's
only once the API server answered 201 to the operator's create, and then its name is
recorded in the job's status.secrets (job_secrets.py); the pods mount only recorded names
(`BuildContext.secret_names`), never a Secret that already existed under a wanted name.

- TLS (`<job>-tls-<random>`): a self-signed CA and a certificate for every server Service
  name, valid `BuildContext.tls_valid_s`; the servers mount the whole Secret, clients only
  `ca.crt`. Not minted when the user names their own (tlsSecretName), nor without TLS.
  Renewed before it expires as a new Secret (job_secrets.py says when).
- identity (`<job>-identity-<random>`): the server key (`server.key`) and one credential per
  identity (`client-07`, `worker-3`), each HMAC-SHA256(server key, identity) as
  tensor_transport/auth.py derives it. One Secret, created atomically, so the credentials
  always match the key. The servers mount only `server.key`; each client or worker pod
  only the keys of the identities it hosts (`items`), so no pod holds another's
  credential or the key; a pod hosting none mounts nothing (an empty `items` would
  project every key).
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from disttrain_api import constants as c
from disttrain_api.identities import SERVER_KEY, credential

from .common import CONTAINER, BuildContext, metadata, minted_name

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"  # the kubernetes.io/tls layout + ca.crt
# The purposes of the Secrets the operator mints (keys of status.secrets and BuildContext.secret_names).
IDENTITY, TLS = "identity", "tls"
# Random bits of a minted Secret's name: nobody can create every name it might get.
NAME_RANDOM_BYTES = 5
CN_MAX = 64  # X.509 upper bound of a common name (RFC 5280); the SANs carry the full DNS names
TLS_VOLUME = c.TLS_VOLUME
IDENTITY_VOLUME = c.IDENTITY_VOLUME


def _common_name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text[:CN_MAX])])


def tls_secret_name(ctx: BuildContext, user_named: str | None) -> str:
    return user_named or ctx.secret_names.get(TLS) or minted_name(ctx, TLS)


def identity_secret_name(ctx: BuildContext) -> str:
    return ctx.secret_names.get(IDENTITY) or minted_name(ctx, IDENTITY)


def fresh_secret_name(job: str, purpose: str) -> str:
    """`<job>-<purpose>-<10 random hex>`: a name nobody can predict, so nobody can create it first."""
    return f"{job}-{purpose}-{secrets.token_hex(NAME_RANDOM_BYTES)}"


def not_after(tls_secret: dict[str, Any]) -> dt.datetime:
    """When the certificate of a TLS Secret built here expires."""
    cert = x509.load_pem_x509_certificate(base64.b64decode(tls_secret["data"][CERT_FILE]))
    return cert.not_valid_after_utc


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def self_signed_server_cert(
    dns_names: list[str], *, now: dt.datetime | None = None, valid: dt.timedelta = dt.timedelta(days=365)
) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate, server key), PEM. The CA key is discarded: nothing else is signed.

    Names: the shortest DNS name (the Service's) in the common names, cut to 64 characters
    (a job and namespace of legal lengths make a longer FQDN); clients verify the SANs."""
    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    short = min(dns_names, key=len)
    ca_name = _common_name(f"disttrain CA {short}")
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_common_name(short))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + valid)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), cert.public_bytes(pem), _pem_key(key)


def service_dns_names(namespace: str, service: str) -> list[str]:
    return [f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}.svc", f"{service}.{namespace}", service]


def _secret(ctx: BuildContext, name: str, data: dict[str, bytes], type_: str = "Opaque") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(ctx, name, {c.LABEL_JOB: ctx.name}),
        "type": type_,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def build_tls_secret(ctx: BuildContext, services: Sequence[str]) -> dict[str, Any]:
    """One certificate valid for every server Service (parameter-server shards share it)."""
    names = [n for svc in services for n in service_dns_names(ctx.namespace, svc)]
    ca, cert, key = self_signed_server_cert(names, valid=dt.timedelta(seconds=ctx.tls_valid_s))
    return _secret(ctx, tls_secret_name(ctx, None), {CA_FILE: ca, CERT_FILE: cert, KEY_FILE: key})


def build_identity_secret(ctx: BuildContext, identities: Sequence[str]) -> dict[str, Any]:
    key = secrets.token_bytes(32)
    data = {SERVER_KEY: key.hex().encode(), **{i: credential(key, i).hex().encode() for i in identities}}
    return _secret(ctx, identity_secret_name(ctx), data)


# ----------------------------------------------------------------------------- mounts


def mount(pod_spec: dict[str, Any], *, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]],
          env: dict[str, str]) -> None:  # fmt: skip
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), *volumes]
    for container in pod_spec["containers"]:
        if container["name"] == CONTAINER:
            container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
            have = {e["name"] for e in container.get("env", [])}  # never override what the user set
            container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in env.items() if k not in have)]


def secure_pod(pod_spec: dict[str, Any], ctx: BuildContext, *, tls_secret: str | None, identities: Sequence[str],
               server: bool) -> None:  # fmt: skip
    """Mount into one pod what its side needs: a server the whole TLS Secret and the server key;
    a client or worker `ca.crt` and the credentials of `identities` (its own) only. Optional
    volumes: a key the Secret lacks (the gang grew past what was minted) reaches the trainer as
    a missing file, which it reports by name, instead of a pod stuck in ContainerCreating."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    env = {c.ENV_IDENTITY_DIR: c.IDENTITY_MOUNT_DIR}
    keys = [SERVER_KEY] if server else sorted(identities)
    if keys:
        volumes.append({"name": IDENTITY_VOLUME, "secret": {
            "secretName": identity_secret_name(ctx), "defaultMode": 0o440, "optional": True,
            "items": [{"key": k, "path": k} for k in keys]}})  # fmt: skip
        mounts.append({"name": IDENTITY_VOLUME, "mountPath": c.IDENTITY_MOUNT_DIR, "readOnly": True})
    if tls_secret is not None:
        tls: dict[str, Any] = {"secretName": tls_secret, "defaultMode": 0o440}
        if not server:
            tls["items"] = [{"key": CA_FILE, "path": CA_FILE}]  # clients never see the server's key
        volumes.append({"name": TLS_VOLUME, "secret": tls})
        mounts.append({"name": TLS_VOLUME, "mountPath": c.TLS_MOUNT_DIR, "readOnly": True})
        env[c.ENV_TLS_DIR] = c.TLS_MOUNT_DIR
    mount(pod_spec, volumes=volumes, mounts=mounts, env=env)
