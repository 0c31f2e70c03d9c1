"""Each node of the local cluster is a host of its own: its kubelet's files that the 1.20 kubelet
keeps under /var/lib/kubelet whatever its --root-dir (the device-plugin socket, the self-signed
serving certificate) are the node's, not shared with the other kubelets on this machine."""

from __future__ import annotations

import socket
import ssl
import stat
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

KUBELET_PORT = 10250


def serving_certificate_name(ip: str) -> str:
    """The common name of the certificate the kubelet at `ip` serves (its own, self-signed)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((ip, KUBELET_PORT), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der, f"the kubelet at {ip}:{KUBELET_PORT} served no certificate"
    cn = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else ""


def test_every_kubelet_serves_its_own_certificate_and_has_its_own_device_plugin_socket(kube: Any,
                                                                                      local_cluster: Any) -> None:
    nodes = {n.metadata.name: next(a.address for a in n.status.addresses if a.type == "InternalIP")
             for n in kube.core.list_node().items}
    assert sorted(nodes) == sorted(local_cluster.node_names)
    for name, ip in nodes.items():
        # "<hostname>@<unix time>", as the kubelet names the certificate it makes for itself.
        assert serving_certificate_name(ip).split("@")[0] == name, f"{name} ({ip}) serves another node's certificate"
    # Two kubelets sharing /var/lib/kubelet/device-plugins clear it and listen on one kubelet.sock
    # as they start: one of them dies ("bind: address already in use").
    sockets = [local_cluster.cfg.node_dir(node) / "var-lib-kubelet" / "device-plugins" / "kubelet.sock"
               for node in local_cluster.cfg.nodes]
    for path in sockets:
        assert path.exists() and stat.S_ISSOCK(path.stat().st_mode), f"no device-plugin socket of its own: {path}"
    assert len({p.stat().st_ino for p in sockets}) == len(sockets)
