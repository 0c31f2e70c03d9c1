"""Functional probes of the controller-manager: bring-up returns only once the controllers
tests depend on really work, not merely once their process runs.

A started kube-controller-manager is not a working one. The garbage collector first
discovers every resource type and waits until an informer per type has listed it
("all resource monitors have synced"); until then a deleted owner's dependents stay.
Each controller also runs under its own service account (--use-service-account-
credentials), whose token the tokens controller must mint before that controller can
call the API at all. Seconds after the process starts, a test that deletes an owner
waits for a collector that is not collecting yet. So each probe does what a test does
and waits for the effect:

- service accounts: a fresh namespace gets its `default` ServiceAccount with a token
  (pods cannot be created in a namespace before that);
- garbage collector: a dependent ConfigMap goes once its owner ConfigMap is deleted;
- node lifecycle: the node controller has registered every node (its `RegisteredNode`
  Event): from then on it watches their heartbeats and taints a lost node.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence

from .proc import ClusterError, say

PROBE_NAMESPACE = "localcluster-probe"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _wait(what: str, probe: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if probe():
            return time.monotonic() - start
        time.sleep(0.5)
    raise ClusterError("controllers", f"timed out after {timeout:.0f}s waiting for {what}")


def _json(kubectl: Kubectl, *args: str) -> dict | None:  # type: ignore[type-arg]
    res = kubectl(*args, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def service_accounts(kubectl: Kubectl, namespace: str, timeout: float) -> float:
    kubectl("create", "namespace", namespace)

    def token() -> bool:
        sa = _json(kubectl, "get", "serviceaccount", "default", "-n", namespace)
        return bool(sa and sa.get("secrets"))

    return _wait(f"the default ServiceAccount token in namespace {namespace}", token, timeout)


def garbage_collector(kubectl: Kubectl, namespace: str, timeout: float) -> float:
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gc-owner", "namespace": namespace}}
    kubectl("apply", "-f", "-", input=json.dumps(owner))
    got = _json(kubectl, "get", "configmap", "gc-owner", "-n", namespace)
    if got is None:
        raise ClusterError("controllers", "the garbage-collector probe's owner ConfigMap vanished")
    dependent = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "gc-dependent", "namespace": namespace,
                              "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-owner",
                                                   "uid": got["metadata"]["uid"]}]}}
    kubectl("apply", "-f", "-", input=json.dumps(dependent))
    kubectl("delete", "configmap", "gc-owner", "-n", namespace, "--wait=false")

    def collected() -> bool:
        res = kubectl("get", "configmap", "gc-dependent", "-n", namespace, "--ignore-not-found", "-o", "name",
                      check=False)
        return res.returncode == 0 and res.stdout.strip() == ""

    return _wait("the garbage collector to delete a dependent of a deleted owner", collected, timeout)


def node_lifecycle(kubectl: Kubectl, nodes: Sequence[str], timeout: float) -> float:
    def registered() -> bool:
        events = _json(kubectl, "get", "events", "-n", "default", "--field-selector", "reason=RegisteredNode")
        seen = {e["involvedObject"]["name"] for e in (events or {}).get("items", [])}
        return set(nodes) <= seen

    return _wait(f"the node controller to register nodes {', '.join(nodes)}", registered, timeout)


def controllers_work(kubectl: Kubectl, nodes: Sequence[str], timeout: float) -> None:
    """All three probes (in one namespace, removed afterwards); raise ClusterError on the
    first that does not pass within `timeout` seconds."""
    kubectl("delete", "namespace", PROBE_NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
    took = {
        "node lifecycle": node_lifecycle(kubectl, nodes, timeout),
        "service accounts": service_accounts(kubectl, PROBE_NAMESPACE, timeout),
        "garbage collector": garbage_collector(kubectl, PROBE_NAMESPACE, timeout),
    }
    kubectl("delete", "namespace", PROBE_NAMESPACE, "--wait=false", check=False)
    say("controllers work: " + ", ".join(f"{k} after {v:.1f}s" for k, v in took.items()))
