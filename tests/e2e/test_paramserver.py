"""Mode paramserver on a real cluster: the example Succeeds with >= 0.95; a killed worker pod is
replaced alone (same attempt, no gang restart) and the job still Succeeds.

Written against tests/e2e/conftest.py (host-process operator, per-test namespace); the server
shards are Deployments, the workers dial them by their Service names.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml

from .conftest import ROOT, Kubectl, OperatorProcess, wait_event  # type: ignore[import-not-found]
from .test_operator import kill_worker  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(900)


def example(name: str, ns: str) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "manifests" / "examples" / "paramserver.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": ns}
    # Six pods (4 workers, 2 server shards: both take the workers' resources) at 250m: 1.5 CPUs of
    # the local cluster's 4 (2 nodes x 2), so the other cluster lane's job (the helm test's, 1.6)
    # fits beside it. At 500m (3 CPUs) this job waited Pending ("Insufficient cpu") for 300 s.
    obj["spec"]["workers"]["resources"]["cpu"] = "250m"
    return obj


def test_paramserver_example_succeeds(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    name = f"ps-{uuid.uuid4().hex[:5]}"
    kubectl.apply(example(name, namespace))
    def deployments() -> list[str]:
        return sorted(d["metadata"]["name"] for d in kubectl.json(
            "get", "deployments", "-n", namespace, "-l", f"disttrain.dev/job-name={name}")["items"])  # fmt: skip

    # The operator creates the shards one after the other: wait for both, then check the names.
    kubectl.wait_for("both shard Deployments", lambda: len(deployments()) >= 2, timeout=120)
    assert deployments() == [f"{name}-server-0", f"{name}-server-1"]
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["result"]["testAccuracy"] >= 0.95, status["result"]
    assert status["result"]["mode"] == "paramserver" and status["restarts"] == 0
    # Over TLS with per-worker credentials: the operator minted both Secrets and mounted them.
    minted = status["secrets"]  # created by the operator, recorded once the API server had them
    secrets = kubectl.run("get", "secrets", "-n", namespace, "-l", f"disttrain.dev/job-name={name}", "-o", "name")
    assert sorted(secrets.stdout.split()) == [f"secret/{minted['identity']}", f"secret/{minted['tls']}"]
    assert minted["identity"].startswith(f"{name}-identity-") and minted["tls"].startswith(f"{name}-tls-")


def test_paramserver_killed_worker_is_replaced_alone(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = f"ps-kill-{uuid.uuid4().hex[:5]}"
    obj = example(name, namespace)
    obj["spec"]["training"]["steps"] = 1500
    kubectl.apply(obj)
    kubectl.wait_phase(namespace, name, ("Running",), timeout=300)
    kubectl.wait_for("training progress", lambda: int((kubectl.job(namespace, name).get("status") or {})
                                                       .get("step") or 0) >= 50, timeout=300, interval=1.0)
    others = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(namespace, name)
              if p["metadata"]["name"] != f"{name}-worker-2"}
    counter = kill_worker(request, kubectl, namespace, name, f"{name}-worker-2")
    kubectl.wait_for(f"{counter} == 1", lambda: int((kubectl.job(namespace, name).get("status") or {})
                                                     .get(counter) or 0) >= 1, timeout=120, interval=1.0)
    wait_event(kubectl, namespace, name, "WorkerReplaced" if counter == "restarts" else "Disrupted")
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=800)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert job["status"]["attempt"] == 0  # no gang restart
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(namespace, name)}
    for pod, uid in others.items():  # every other pod (workers and servers) is the one that started
        if pod in now:
            assert now[pod] == uid, pod
