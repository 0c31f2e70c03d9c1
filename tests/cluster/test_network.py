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
    script = (
        f"for i in $(seq 60); do wget -q -T 2 -O /tmp/a http://{fqdn}:8080/ && break; sleep 1; done; "
        "echo headless=$(cat /tmp/a); "
        "for i in $(seq 60); do wget -q -T 2 -O /tmp/b http://web/ && break; sleep 1; done; "
        "echo service=$(cat /tmp/b)"
    )
    kube.core.create_namespaced_pod(namespace, kube.pod("client", node=b, command=["sh", "-c", script]))
    done = kube.wait_phase(namespace, "client", ("Succeeded",), timeout=150)
    server = kube.core.read_namespaced_pod("server", namespace)
    assert server.spec.node_name == a and done.spec.node_name == b, "pods must sit on different nodes"
    out = kube.logs(namespace, "client")
    assert "headless=server" in out, out
    assert "service=server" in out, out
