"""Certificates (openssl), static tokens and kubeconfigs for the control plane and nodes.

Clients authenticate with static bearer tokens (--token-auth-file); TLS uses one local CA whose
certificate also goes into service-account secrets, so in-cluster clients verify the apiserver.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import yaml

from .config import APISERVER_PORT, BRIDGE_IP, KUBERNETES_SERVICE_IP, ClusterConfig
from .proc import run

SANS = ",".join(
    [
        f"IP:{BRIDGE_IP}",
        f"IP:{KUBERNETES_SERVICE_IP}",
        "IP:127.0.0.1",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
)


def make_pki(cfg: ClusterConfig) -> None:
    d = cfg.pki
    d.mkdir(parents=True, exist_ok=True)
    log = cfg.logs / "pki.log"
    if not (d / "ca.crt").exists():
        run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-keyout", d / "ca.key", "-out", d / "ca.crt", "-subj", "/CN=disttrain-local-ca"],
            step="pki", log=log)
    if not (d / "apiserver.crt").exists():
        run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", d / "apiserver.key",
             "-out", d / "apiserver.csr", "-subj", "/CN=kube-apiserver"], step="pki", log=log)
        ext = d / "apiserver.ext"
        ext.write_text(f"subjectAltName={SANS}\nextendedKeyUsage=serverAuth\n")
        run(["openssl", "x509", "-req", "-in", d / "apiserver.csr", "-CA", d / "ca.crt",
             "-CAkey", d / "ca.key", "-CAcreateserial", "-days", "3650", "-extfile", ext,
             "-out", d / "apiserver.crt"], step="pki", log=log)
    if not (d / "sa.key").exists():
        run(["openssl", "genrsa", "-out", d / "sa.key", "2048"], step="pki", log=log)
        run(["openssl", "rsa", "-in", d / "sa.key", "-pubout", "-out", d / "sa.pub"], step="pki", log=log)


def identities(cfg: ClusterConfig) -> dict[str, tuple[str, str]]:
    """kubeconfig file stem -> (user, groups). Node users let the Node authorizer work."""
    ids = {
        "admin": ("disttrain-admin", "system:masters"),
        "controller-manager": ("system:kube-controller-manager", ""),
        "scheduler": ("system:kube-scheduler", ""),
        "kube-proxy": ("system:kube-proxy", ""),
    }
    for n in cfg.nodes:
        ids[f"kubelet-{n.name}"] = (f"system:node:{n.name}", "system:nodes")
    return ids


def write_tokens_and_kubeconfigs(cfg: ClusterConfig) -> None:
    """Fresh tokens per bring-up (etcd is fresh too); the admin kubeconfig is the public one."""
    lines = []
    ca = (cfg.pki / "ca.crt").as_posix()
    for stem, (user, groups) in identities(cfg).items():
        token = secrets.token_hex(24)
        lines.append(f'{token},{user},{user},"{groups}"' if groups else f"{token},{user},{user}")
        path = cfg.kubeconfig if stem == "admin" else cfg.pki / f"{stem}.kubeconfig"
        write_kubeconfig(path, token=token, ca=ca, user=user)
    tokens = cfg.pki / "tokens.csv"
    tokens.write_text("\n".join(lines) + "\n")
    tokens.chmod(0o600)


def write_kubeconfig(path: Path, *, token: str, ca: str, user: str) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "disttrain-local", "cluster": {
            "server": f"https://{BRIDGE_IP}:{APISERVER_PORT}", "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "disttrain-local", "context": {"cluster": "disttrain-local", "user": user}}],
        "current-context": "disttrain-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
