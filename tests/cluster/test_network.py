"""Pod networking across nodes, cluster DNS (headless pod names, Service names), kube-proxy."""

from __future__ import annotations

from kubernetes import client


def test_cross_node_tcp_by_headless_dns_and_clusterip_service(kube, namespace, local_cluster):
    a, b = local_cluster.node_names[:2]
    labels = {"app": "web"}
    kube.core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name="peers"),
        spec=client.V1ServiceSpec(cluster_ip="None", selector=labels,
                                  ports=[client.V1ServicePort(port=8080, name="http")])))
    kube.core.create_namespaced_service(namespace, client.V1Service(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1ServiceSpec(selector=labels,
                                  ports=[client.V1ServicePort(port=80, target_port=8080, name="http")])))
    kube.core.create_namespaced_pod(namespace, kube.pod(
        "server", node=a, labels=labels, hostname="server", subdomain="peers",
        command=["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]))
    kube.wait_phase(namespace, "server", ("Running",))
    fqdn = f"server.peers.{namespace}.svc.cluster.local"
    # DNS records appear a few seconds after the pod starts: retry, as the trainer does.
    # (python: busybox's static wget cannot resolve names through glibc's NSS)
    script = f"""
import time, urllib.request
def get(url):
    for _ in range(60):
        try:
            return urllib.request.urlopen(url, timeout=2).read().decode().strip()
        except OSError as e:
            err = e
            time.sleep(1)
    return f"error: {{err}}"
print("headless=" + get("http://{fqdn}:8080/"))
print("service=" + get("http://web/"))
"""
    kube.core.create_namespaced_pod(namespace, kube.pod(
        "client", node=b, image=kube.trainer_image, command=["python", "-c", script]))
    done = kube.wait_phase(namespace, "client", ("Succeeded",), timeout=150)
    server = kube.core.read_namespaced_pod("server", namespace)
    assert server.spec.node_name == a and done.spec.node_name == b, "pods must sit on different nodes"
    out = kube.logs(namespace, "client")
    assert "headless=server" in out, out
    assert "service=server" in out, out
