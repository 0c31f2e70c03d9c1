"""Every recovery path the operator claims, on a real cluster: elastic shrink after a node
is lost, activeDeadlineSeconds, ttlSecondsAfterFinished (suspend and resume:
test_disruptions.py).

Training jobs keep checkpoints on the claim the operator makes for each job (ReadWriteMany: on the
local cluster a folder of this machine that every node shares), so a gang recreated on any node
resumes from them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import (  # type: ignore[import-not-found]
    Kubectl,
    OperatorProcess,
    assert_no_repeated_events,
    checkpoint_steps,
    condition,
    job_manifest,
    wait_for_room,
)

pytestmark = pytest.mark.timeout(600)
JOBS = "disttrainjobs.disttrain.dev"
SLEEPER = {"replicas": 2, "resources": {"cpu": "100m", "memory": "64Mi"}}


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


@pytest.fixture
def job_name() -> Iterator[str]:
    """A unique job name (its checkpoints go with its namespace)."""
    yield uniq("rec")


def training_job(name: str, ns: str, *, steps: int, interval: int, **spec: Any) -> dict[str, Any]:
    # A model big enough that a run lasts tens of seconds: the faults below must land mid-run.
    spec.setdefault("model", {"name": "mlp", "hidden": 256, "layers": 3})
    obj = job_manifest(name, ns, steps=steps, checkpoint={"intervalSteps": interval, "keep": 2}, **spec)
    obj["spec"]["training"]["evalIntervalSteps"] = 0
    return obj


def wait_for_checkpoint(kubectl: Kubectl, ns: str, name: str, at_least: int) -> int:
    def reached() -> int:
        newest = max(checkpoint_steps(kubectl, ns, name), default=0)
        return newest if newest >= at_least else 0

    return int(kubectl.wait_for(f"a checkpoint of {name} at step >= {at_least}", reached, timeout=300, interval=0.5))


@pytest.mark.whole_cluster  # stops a node
def test_elastic_shrink_after_a_node_is_stopped(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, namespace: str, job_name: str
) -> None:
    cluster = request.getfixturevalue("local_cluster")  # stops a node: the local cluster only
    name = job_name
    # One worker per node (anti-affinity), so with a node gone only one fits: the gang of 2
    # cannot be placed and shrinks to 1 (a valid size: batch 64 splits over 1 and 2 ranks).
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"disttrain.dev/job-name": name}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    obj = training_job(name, namespace, steps=600, interval=20,
                       workers={"replicas": 2, "resources": {"cpu": "500m", "memory": "768Mi"},
                                "template": {"affinity": anti}},
                       data={"batchSize": 64},
                       elastic={"minReplicas": 1, "maxReplicas": 2, "scheduleTimeoutSeconds": 5},
                       runPolicy={"backoffLimit": 4})
    # The gang must start at 2 (one pod per node): an earlier test's pods still leaving, or a
    # node still tainted after a restart, would make the operator shrink it before the fault.
    wait_for_room(kubectl, 500)
    kubectl.apply(obj)
    job = kubectl.wait_phase(namespace, name, ("Running",), timeout=300)
    assert job["status"].get("replicas") == 2, f"the gang started below 2 replicas: {job['status']}"
    wait_for_checkpoint(kubectl, namespace, name, 20)

    def second_workers_node() -> str | None:
        # Read again until found: a pod being replaced (a gang restart) is briefly absent.
        return next((p["spec"].get("nodeName") for p in kubectl.pods(namespace, name)
                     if p["metadata"]["labels"]["disttrain.dev/replica-index"] == "1"
                     and not p["metadata"].get("deletionTimestamp")), None)  # fmt: skip

    victim = kubectl.wait_for("worker 1 on a node", second_workers_node, timeout=120, interval=1.0)
    cluster.stop_node(victim)
    try:
        def shrunk() -> dict[str, Any] | None:
            job = kubectl.job(namespace, name)
            return job if (job.get("status") or {}).get("replicas") == 1 else None

        job = kubectl.wait_for("the gang to shrink to 1 replica", shrunk, timeout=240, interval=1.0)
        job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=400)
    finally:
        cluster.start_node(victim)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["replicas"] == 1, status
    result = status["result"]
    assert result["worldSize"] == 1 and result["resumedFromStep"] >= 20, result
    assert result["steps"] == 600
    reasons = [e["reason"] for e in assert_no_repeated_events(kubectl, namespace, name)]
    assert "ElasticShrink" in reasons, reasons
    (pod,) = [p for p in kubectl.pods(namespace, name) if not p["metadata"].get("deletionTimestamp")]
    assert pod["spec"]["nodeName"] != victim


def test_active_deadline_fails_the_job_and_removes_its_pods(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = uniq("deadline")
    kubectl.apply(job_manifest(name, namespace, sleep=600, workers=SLEEPER, runPolicy={"activeDeadlineSeconds": 6}))
    job = kubectl.wait_phase(namespace, name, ("Failed", "Succeeded"), timeout=120)
    assert job["status"]["phase"] == "Failed"
    cond = condition(job, "Failed")
    assert cond and cond["reason"] == "DeadlineExceeded", job["status"]
    kubectl.wait_for("the pods to go", lambda: not [p for p in kubectl.pods(namespace, name)
                                                     if not p["metadata"].get("deletionTimestamp")], timeout=60)
    assert_no_repeated_events(kubectl, namespace, name)


def test_ttl_after_finished_deletes_the_job(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    name = uniq("ttl")
    kubectl.apply(job_manifest(name, namespace, sleep=1, workers=SLEEPER,
                               runPolicy={"ttlSecondsAfterFinished": 3}))
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=120)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    kubectl.wait_for("the finished job to be deleted", lambda: kubectl.run(
        "get", JOBS, name, "-n", namespace, "--ignore-not-found", "-o", "name").stdout.strip() == "", timeout=60)


def test_a_trainer_that_exits_3_by_itself_reaches_the_backoff_limit(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """Exit 3 is the stop code, but nobody deleted these pods: each gang counts as a failure, and
    the job fails at runPolicy.backoffLimit instead of restarting forever as disruptions."""
    name = uniq("exit3")
    obj = job_manifest(name, namespace, sleep=1, workers=SLEEPER, runPolicy={"backoffLimit": 1})
    obj["spec"]["workers"]["template"]["containers"][0]["command"] = ["sh", "-c", "exit 3"]
    kubectl.apply(obj)
    job = kubectl.wait_phase(namespace, name, ("Failed", "Succeeded"), timeout=180)
    status = job["status"]
    cond = condition(job, "Failed")
    assert cond and cond["reason"] == "BackoffLimitExceeded" and "exit code 3" in cond["message"], status
    assert status["restarts"] == 1 and status["disruptions"] == 0, status
