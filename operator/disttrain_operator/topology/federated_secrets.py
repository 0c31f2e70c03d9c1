"""Secrets of a federated job: a self-signed CA + aggregator certificate, and the token key.

Pure builders (no API calls). The reconciler creates each Secret once, when the
user named none (spec.federated.tlsSecretName / tokenSecretName), and never
rebuilds it: a new CA or key on every reconcile would cut off running clients.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from disttrain_api import constants as c
from disttrain_api.model import FederatedSpec

from .common import BuildContext, metadata

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"  # the kubernetes.io/tls layout + ca.crt
VALID_DAYS = 365
CN_MAX = 64  # X.509 upper bound of a common name (RFC 5280); the SANs carry the full DNS names


def _common_name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text[:CN_MAX])])


def _minted(job: str, purpose: str, uid: str) -> str:
    # The operator may only create Secrets, never read them: a name carrying the job's UID
    # makes "already exists" mean "this job created it" (a same-named earlier job had
    # another UID, and its Secret goes with it through the garbage collector).
    return f"{job}-{purpose}-{uid[:8]}" if uid else f"{job}-{purpose}"


def tls_secret_name(job: str, fed: FederatedSpec, uid: str) -> str:
    return fed.tls_secret_name or _minted(job, "federated-tls", uid)


def token_secret_name(job: str, fed: FederatedSpec, uid: str) -> str:
    return fed.token_secret_name or _minted(job, "federated-token", uid)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def self_signed_server_cert(
    dns_names: list[str], *, now: dt.datetime | None = None, days: int = VALID_DAYS
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
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
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
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), cert.public_bytes(pem), _pem_key(key)


def aggregator_dns_names(job: str, namespace: str, service: str) -> list[str]:
    return [f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}.svc", f"{service}.{namespace}", service]


def _secret(ctx: BuildContext, name: str, data: dict[str, bytes], type_: str = "Opaque") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(ctx, name, {c.LABEL_JOB: ctx.name}),
        "type": type_,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def build_tls_secret(ctx: BuildContext, fed: FederatedSpec, service: str) -> dict[str, Any]:
    ca, cert, key = self_signed_server_cert(aggregator_dns_names(ctx.name, ctx.namespace, service))
    return _secret(ctx, tls_secret_name(ctx.name, fed, ctx.uid), {CA_FILE: ca, CERT_FILE: cert, KEY_FILE: key})


def build_token_secret(ctx: BuildContext, fed: FederatedSpec) -> dict[str, Any]:
    return _secret(ctx, token_secret_name(ctx.name, fed, ctx.uid), {c.FED_TOKEN_SECRET_KEY: secrets.token_hex(32).encode()})
