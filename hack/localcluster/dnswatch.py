"""Cluster DNS records for dnsmasq, the design of the old kube-dns.

Watches Services and Pods and writes a hosts file:
  <svc>.<ns>.svc.cluster.local            -> ClusterIP (or every backing pod IP if headless)
  <hostname>.<subdomain>.<ns>.svc.cluster.local -> pod IP, for pods whose subdomain names a
                                             headless Service of their namespace, READY OR NOT
                                             (peers must resolve each other before they are ready)
then SIGHUPs dnsmasq, which re-reads it. Run: python -m localcluster.dnswatch --kubeconfig ...
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

DOMAIN = "svc.cluster.local"


class Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.services: dict[tuple[str, str], Any] = {}
        self.pods: dict[tuple[str, str], Any] = {}
        self.dirty = threading.Event()


def records(store: Store) -> list[tuple[str, str]]:
    with store.lock:
        services = list(store.services.values())
        pods = list(store.pods.values())
    out: list[tuple[str, str]] = []
    headless: dict[tuple[str, str], Any] = {}
    for s in services:
        ns, name = s.metadata.namespace, s.metadata.name
        ip = s.spec.cluster_ip
        if ip and ip != "None":
            out.append((ip, f"{name}.{ns}.{DOMAIN}"))
        else:
            headless[(ns, name)] = s
    for p in pods:
        ip = p.status.pod_ip if p.status else None
        if not ip or p.metadata.deletion_timestamp is not None or p.status.phase in ("Succeeded", "Failed"):
            continue
        ns = p.metadata.namespace
        for (sns, sname), svc in headless.items():
            sel = svc.spec.selector or {}
            labels = p.metadata.labels or {}
            if sns == ns and sel and all(labels.get(k) == v for k, v in sel.items()):
                out.append((ip, f"{sname}.{ns}.{DOMAIN}"))
        sub, host = p.spec.subdomain, p.spec.hostname
        if sub and host and (ns, sub) in headless:
            out.append((ip, f"{host}.{sub}.{ns}.{DOMAIN}"))
    return sorted(set(out))


def follow(store: Store, kind: str, lister: Any) -> None:
    target = store.services if kind == "services" else store.pods
    while True:
        try:
            lst = lister(_request_timeout=30)
            with store.lock:
                target.clear()
                for o in lst.items:
                    target[(o.metadata.namespace, o.metadata.name)] = o
            store.dirty.set()
            w = watch.Watch()
            for ev in w.stream(lister, resource_version=lst.metadata.resource_version, timeout_seconds=300):
                o = ev["object"]
                key = (o.metadata.namespace, o.metadata.name)
                with store.lock:
                    if ev["type"] == "DELETED":
                        target.pop(key, None)
                    else:
                        target[key] = o
                store.dirty.set()
        except Exception as e:  # noqa: BLE001 - apiserver restarts, expired resourceVersions: re-list
            print(f"dnswatch: {kind} watch error: {e}; re-listing", flush=True)
            time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--hosts", required=True, type=Path)
    ap.add_argument("--pid-file", required=True, type=Path)
    a = ap.parse_args()
    config.load_kube_config(config_file=a.kubeconfig)
    v1 = client.CoreV1Api()
    store = Store()
    for kind, lister in (("services", v1.list_service_for_all_namespaces),
                         ("pods", v1.list_pod_for_all_namespaces)):
        threading.Thread(target=follow, args=(store, kind, lister), daemon=True).start()
    last = ""
    while True:
        store.dirty.wait()
        time.sleep(0.1)  # coalesce bursts of events into one rewrite
        store.dirty.clear()
        text = "".join(f"{ip} {name}\n" for ip, name in records(store))
        if text != last:
            tmp = a.hosts.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(a.hosts)
            os.kill(int(a.pid_file.read_text().strip()), signal.SIGHUP)
            last = text
            print(f"dnswatch: {text.count(chr(10))} records", flush=True)


if __name__ == "__main__":
    main()
