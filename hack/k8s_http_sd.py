"""Prometheus HTTP service discovery that serves Kubernetes pods the way kubernetes_sd's pod
role does, for Prometheus builds without kubernetes_sd (Debian's `prometheus` package is one).

Every pod with an IP becomes one target per declared container port (one port-less target per
container without ports), labelled with the pod role's meta labels
(`__meta_kubernetes_namespace`, `__meta_kubernetes_pod_name`, `__meta_kubernetes_pod_label_<name>`,
`__meta_kubernetes_pod_container_port_name`, ...). So a scrape config's relabel_configs are the
same with `kubernetes_sd_configs: [{role: pod}]` and with
`http_sd_configs: [{url: http://HOST:PORT/}]` pointed at this server.

    python hack/k8s_http_sd.py --namespace ml --port 9901   # lists pods with kubectl ($KUBECONFIG)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

META = "__meta_kubernetes_"
CHART_README = Path(__file__).resolve().parents[1] / "charts" / "disttrain" / "README.md"


def sanitize(name: str) -> str:
    """Prometheus's label-name sanitising: every character outside [a-zA-Z0-9_] becomes '_'."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HTTP SD target groups (`[{"targets": [...], "labels": {...}}]`) for these pods."""
    groups: list[dict[str, Any]] = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = next((c["status"] for c in status.get("conditions") or [] if c.get("type") == "Ready"), "false")
        base = {
            f"{META}namespace": meta["namespace"],
            f"{META}pod_name": meta["name"],
            f"{META}pod_ip": ip,
            f"{META}pod_uid": meta.get("uid", ""),
            f"{META}pod_node_name": spec.get("nodeName", ""),
            f"{META}pod_host_ip": status.get("hostIP", ""),
            f"{META}pod_phase": status.get("phase", ""),
            f"{META}pod_ready": str(ready).lower(),
        }
        for key, value in (meta.get("labels") or {}).items():
            base[f"{META}pod_label_{sanitize(key)}"] = value
            base[f"{META}pod_labelpresent_{sanitize(key)}"] = "true"
        for key, value in (meta.get("annotations") or {}).items():
            base[f"{META}pod_annotation_{sanitize(key)}"] = value
            base[f"{META}pod_annotationpresent_{sanitize(key)}"] = "true"
        for container in spec.get("containers") or []:
            labels = {**base, f"{META}pod_container_name": container["name"],
                      f"{META}pod_container_image": container.get("image", "")}
            ports = container.get("ports") or []
            if not ports:
                groups.append({"targets": [ip], "labels": labels})
            for port in ports:
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **labels,
                    f"{META}pod_container_port_name": port.get("name", ""),
                    f"{META}pod_container_port_number": str(port["containerPort"]),
                    f"{META}pod_container_port_protocol": port.get("protocol", "TCP"),
                }})
    return groups


def documented_scrape_job(sd_url: str, refresh: str = "2s") -> dict[str, Any]:
    """The worker scrape job of the chart's README (kubernetes_sd, pod role) with its discovery
    swapped for this server; relabel_configs exactly as documented."""
    block = CHART_README.read_text().split("```yaml\nscrape_configs:", 1)[1].split("```", 1)[0]
    (job,) = yaml.safe_load("scrape_configs:" + block)["scrape_configs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}], "the README's scrape job changed shape"
    return {**job, "http_sd_configs": [{"url": sd_url, "refresh_interval": refresh}]}


def kubectl_pods(namespace: str | None, kubeconfig: str | None = None) -> Callable[[], list[dict[str, Any]]]:
    """A pod lister through kubectl (one namespace, or all with None)."""
    args = ["kubectl", *([f"--kubeconfig={kubeconfig}"] if kubeconfig else []), "get", "pods", "-o", "json",
            *(["-n", namespace] if namespace else ["--all-namespaces"])]

    def list_pods() -> list[dict[str, Any]]:
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=30).stdout
        return json.loads(out)["items"]

    return list_pods


def serve(list_pods: Callable[[], list[dict[str, Any]]], host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the SD endpoint in a daemon thread; `server.server_address` has the bound port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            try:
                body, code = json.dumps(pod_targets(list_pods())).encode(), 200
            except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
                # Prometheus keeps the last good targets when the SD endpoint fails.
                body, code = str(e).encode(), 500
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                # Prometheus gave up on this answer (its refresh timed out while the pods were
                # listed on a busy host) and asks again at the next refresh.
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--namespace", help="only this namespace (default: all)")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9901)
    a = ap.parse_args()
    server = serve(kubectl_pods(a.namespace, a.kubeconfig), a.host, a.port)
    print(f"serving Kubernetes pod targets on http://{a.host}:{server.server_address[1]}/", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
