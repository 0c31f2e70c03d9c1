"""The operator against a real cluster (host-process operator; see conftest)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import (  # type: ignore[import-not-found]
    Kubectl,
    OperatorProcess,
    assert_no_repeated_events,
    checkpoint_dir,
    checkpoint_steps,
    condition,
    digits_manifest,
    job_claim,
    job_manifest,
    wait_event,
)
from .test_chaos import kill_when_running  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(900)


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def kill_worker(request: pytest.FixtureRequest, kubectl: Kubectl, ns: str, job: str, pod: str) -> str:
    """Kill the trainer process inside the pod of the job's current gang once it runs (the pod
    object stays: it turns Failed); returns the status counter the operator counts it in."""
    local = Path(os.environ.get("DISTTRAIN_CACHE", Path.home() / ".cache" / "disttrain")) / "cluster" / "kubeconfig"
    if Path(kubectl.kubeconfig).resolve() != local.resolve():
        # Another cluster (kind): no node access; deleting the pod is the closest failure, and a
        # pod deleted by someone other than the operator is a disruption, not a restart.
        kubectl.run("delete", "pod", pod, "-n", ns, "--wait=false")
        return "disruptions"
    kill_when_running(request.getfixturevalue("local_cluster"), kubectl, ns, job, pod)
    return "restarts"


def test_invalid_field_is_refused_by_the_api_server(kubectl: Kubectl, crd: None, namespace: str) -> None:
    obj = job_manifest("bad", namespace)
    obj["spec"]["workers"]["replicas"] = 0
    proc = kubectl.apply(obj, check=False)
    assert proc.returncode != 0
    assert "spec.workers.replicas" in proc.stderr, proc.stderr
    obj["spec"]["workers"]["replicas"] = "two"
    proc = kubectl.apply(obj, check=False)
    assert proc.returncode != 0 and "spec.workers.replicas" in proc.stderr, proc.stderr


def test_cross_field_invalid_gets_invalid_spec_and_no_pods(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = uniq("xfield")
    kubectl.apply(job_manifest(name, namespace, parallelism={"tensor": 2}))  # tensor > 1 in mode data
    job = kubectl.wait_phase(namespace, name, ("Failed",), timeout=60)
    cond = condition(job, "InvalidSpec")
    assert cond and cond["status"] == "True", job["status"]
    assert "spec.parallelism.tensor" in cond["message"] and "mode data" in cond["message"]
    wait_event(kubectl, namespace, name, "InvalidSpec")
    time.sleep(3)
    assert kubectl.pods(namespace, name) == []


def test_gpu_request_beyond_the_cluster_stays_pending(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = uniq("gpus")
    kubectl.apply(job_manifest(name, namespace, sleep=60,
                               workers={"replicas": 1, "resources": {"gpus": 64, "cpu": "100m", "memory": "64Mi"}}))

    def unschedulable() -> dict[str, Any] | None:
        # Until the job's checkpoint claim is bound the scheduler names the claim ("unbound immediate
        # PersistentVolumeClaims"); then the GPUs no node has.
        job = kubectl.job(namespace, name)
        cond = condition(job, "Running")
        return job if cond and cond["reason"] == "Unschedulable" and "nvidia.com/gpu" in cond["message"] else None

    job = kubectl.wait_for("Unschedulable condition naming nvidia.com/gpu", unschedulable, timeout=150)
    assert job["status"]["phase"] == "Pending"
    (pod,) = kubectl.pods(namespace, name)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "64"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])
    time.sleep(6)  # it stays Pending: no restarts, no failure
    job = kubectl.job(namespace, name)
    assert job["status"]["phase"] == "Pending" and job["status"].get("restarts", 0) == 0


def test_deleting_the_job_removes_every_child(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    name = uniq("del")
    kubectl.apply(job_manifest(name, namespace, sleep=600,
                               workers={"replicas": 2, "resources": {"cpu": "100m", "memory": "64Mi"}}))
    kubectl.wait_phase(namespace, name, ("Running",), timeout=120)
    selector = f"disttrain.dev/job-name={name}"
    kinds = "pods,services,configmaps"
    children = kubectl.json("get", kinds, "-n", namespace, "-l", selector)["items"]
    assert {c["kind"] for c in children} == {"Pod", "Service", "ConfigMap"}
    uid = kubectl.job(namespace, name)["metadata"]["uid"]
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == uid for c in children)
    kubectl.run("delete", "disttrainjobs.disttrain.dev", name, "-n", namespace, "--wait=true", timeout=120)
    kubectl.wait_for("children gone",
                     lambda: not kubectl.json("get", kinds, "-n", namespace, "-l", selector)["items"], timeout=120)


def healthz(op: OperatorProcess) -> dict[str, Any] | None:
    """The liveness endpoint's answer (kopf runs our probes), or None when it does not answer 200."""
    try:
        with urllib.request.urlopen(op.liveness_url, timeout=5) as r:
            return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError):
        return None


def test_operator_restart_adopts_jobs_without_duplicates_and_is_healthy(
    kubectl: Kubectl, crd: None, own_namespace: str, tmp_path: Path
) -> None:
    ns = own_namespace
    op = OperatorProcess(kubectl, [ns], tmp_path / "operator.log")
    op.start()
    try:
        name = uniq("adopt")
        kubectl.apply(job_manifest(name, ns, sleep=600,
                                   workers={"replicas": 3, "resources": {"cpu": "100m", "memory": "64Mi"}}))
        kubectl.wait_phase(ns, name, ("Running",), timeout=120)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, name)}
        assert len(before) == 3
        op.kill()
        assert healthz(op) is None  # the endpoint is really the operator's
        op.start()
        # Healthy: the liveness endpoint answers, its probes see the job and live reconcile workers.
        # (kopf caches probe results for 10 s: the first answer may predate the job listing.)
        health = kubectl.wait_for("the restarted operator's liveness endpoint to see the job",
                                  lambda: (h := healthz(op)) is not None and h.get("jobs") == 1 and h,
                                  timeout=60, interval=1.0)
        assert health["queueAgeSeconds"] < 30, health
        # ...and it reconciles: a job created after the restart gets its gang.
        fresh = uniq("fresh")
        kubectl.apply(job_manifest(fresh, ns, sleep=600,
                                   workers={"replicas": 1, "resources": {"cpu": "100m", "memory": "64Mi"}}))
        kubectl.wait_phase(ns, fresh, ("Running",), timeout=120)
        time.sleep(6)  # several progress intervals of the new operator
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, name)}
        assert after == before, "the restarted operator recreated or duplicated pods"
        job = kubectl.job(ns, name)
        assert job["status"]["phase"] == "Running" and job["status"].get("restarts", 0) == 0
        assert_no_repeated_events(kubectl, ns, name)
    finally:
        op.stop()
        print(op.tail())


def test_the_data_parallel_example_resumes_a_killed_worker_from_its_last_checkpoint(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """The example as shipped (no checkpoint volume): the operator makes its claim, a worker is
    killed mid-run, the restarted gang resumes from the newest checkpoint (not step 0), and the
    claim and its volume go when the job is deleted."""
    name = uniq("kill")
    obj = digits_manifest(name, namespace, training={"steps": 1000, "evalIntervalSteps": 0},
                          checkpoint={"intervalSteps": 50})
    assert "volume" not in obj["spec"]["checkpoint"]
    kubectl.apply(obj)
    job = kubectl.wait_phase(namespace, name, ("Running",), timeout=300)
    claim = job_claim(kubectl, namespace, name)
    assert claim["status"]["phase"] == "Bound" and claim["spec"]["accessModes"] == ["ReadWriteMany"], claim
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("DistTrainJob", job["metadata"]["uid"])
    assert condition(job, "CheckpointsEphemeral") is None

    def checkpointed() -> int:
        status = kubectl.job(namespace, name).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            raise AssertionError(f"{name} finished before its worker could be killed: {status}")
        return max(checkpoint_steps(kubectl, namespace, name), default=0)

    kubectl.wait_for("a first checkpoint", checkpointed, timeout=300, interval=0.5)
    counter = kill_worker(request, kubectl, namespace, name, f"{name}-worker-1")
    before = max(checkpoint_steps(kubectl, namespace, name))  # a newer one may land before the restart
    assert before < 1000, f"the kill came after the last step ({before})"

    def restarted() -> dict[str, Any] | None:
        job = kubectl.job(namespace, name)
        return job if int((job.get("status") or {}).get(counter) or 0) >= 1 else None

    job = kubectl.wait_for(f"{counter} == 1", restarted, timeout=120, interval=1.0)
    assert condition(job, "Restarting") is not None

    wait_event(kubectl, namespace, name, "WorkerFailed", "WorkerVanished", "Disrupted")
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status[counter] == 1 and status["restarts"] + status["disruptions"] == 1, status
    assert status["result"]["resumedFromStep"] >= before > 0, (before, status["result"])
    assert status["result"]["testAccuracy"] >= 0.95, status["result"]
    assert_no_repeated_events(kubectl, namespace, name)
    pods = kubectl.pods(namespace, name)
    assert {p["metadata"]["labels"]["disttrain.dev/restart-attempt"] for p in pods} == {"1"}
    # Deleted with the job (its owner), and its volume with it (the class's reclaim policy).
    folder = checkpoint_dir(kubectl, namespace, name)
    kubectl.run("delete", "disttrainjobs.disttrain.dev", name, "-n", namespace, "--wait=false")
    kubectl.wait_for("the claim to go with its job", lambda: kubectl.run(
        "get", "pvc", f"{name}-checkpoints", "-n", namespace, "--ignore-not-found", "-o", "name").stdout.strip() == "",
        timeout=120, interval=1.0)
    if folder is not None and str(folder).startswith("/tmp/hostpath_pv/"):  # the local cluster's provisioner
        kubectl.wait_for(f"{folder.parent} to be deleted with its volume", lambda: not folder.parent.exists(),
                         timeout=60, interval=1.0)
