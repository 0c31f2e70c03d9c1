"""The federated example on a cluster: clients reach the aggregator by its Service name over
TLS with per-client tokens (the operator's Secrets), the job Succeeds with >= 0.90 test
accuracy; killing the aggregator pod resumes from its checkpointed round; killing a client
pod leaves the rounds going (no gang restart in this mode).

Needs reconcile to create the two Secrets (disttrain_operator.topology.federated_secrets) and
the aggregator's checkpoint on a volume that outlives its pod (the hostPath below).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import CHECKPOINT_HOSTPATH  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _manifest(name: str, ns: str, **fed: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "manifests" / "examples" / "federated.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": ns}
    obj["spec"]["workers"]["resources"]["cpu"] = "750m"
    obj["spec"]["checkpoint"]["volume"] = {"hostPath": {"path": CHECKPOINT_HOSTPATH, "type": "Directory"}}
    obj["spec"]["federated"].update(fed)
    return obj


def _pods(kubectl: Any, ns: str, name: str, role: str) -> list[dict[str, Any]]:
    return [p for p in kubectl.pods(ns, name)
            if p["metadata"]["labels"].get("disttrain.dev/role") == role]  # fmt: skip


def test_federated_example_succeeds_on_the_cluster(kubectl: Any, operator: Any, namespace: str) -> None:
    kubectl.apply(_manifest("fed", namespace))
    job = kubectl.wait_phase(namespace, "fed", ("Succeeded", "Failed"), timeout=900)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert job["status"]["step"] == 30  # the step column counts rounds
    assert job["status"]["result"]["test_accuracy"] >= 0.90


def test_killed_aggregator_resumes_and_killed_client_is_replaced(kubectl: Any, operator: Any, namespace: str) -> None:
    kubectl.apply(_manifest("fedkill", namespace, rounds=20, roundTimeoutSeconds=20))
    kubectl.wait_for("round 3", lambda: (kubectl.job(namespace, "fedkill").get("status") or {}).get("step", 0) >= 3,
                     timeout=600)  # fmt: skip
    agg = _pods(kubectl, namespace, "fedkill", "aggregator")[0]["metadata"]["name"]
    kubectl.run("delete", "pod", agg, "-n", namespace, "--grace-period=0", "--force")
    client = _pods(kubectl, namespace, "fedkill", "client")[0]["metadata"]["name"]
    kubectl.run("delete", "pod", client, "-n", namespace, "--grace-period=0", "--force")
    job = kubectl.wait_phase(namespace, "fedkill", ("Succeeded", "Failed"), timeout=900)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert job["status"]["restarts"] == 0  # no gang restart in this mode
    assert job["status"]["result"]["resumed_from_step"] >= 3
