"""Ownership: a job's children are its own only by UID (a name held by anything else is a
NameConflict, never deleted), the API server's refusals are reported and bounded, an invalid
edit never kills a running gang, and deleting a job never needs the operator (no finalizer)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import (  # type: ignore[import-not-found]
    Kubectl,
    OperatorProcess,
    assert_no_repeated_events,
    condition,
    events,
    job_manifest,
    wait_event,
)

pytestmark = pytest.mark.timeout(600)
SMALL = {"replicas": 2, "resources": {"cpu": "100m", "memory": "64Mi"}}
JOBS = "disttrainjobs.disttrain.dev"


def controller_uid(obj: dict[str, Any]) -> str:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return refs[0]["uid"] if refs else ""


def test_a_new_job_with_an_old_name_neither_inherits_nor_deletes_the_orphans(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = f"same-{uuid.uuid4().hex[:5]}"
    kubectl.apply(job_manifest(name, namespace, sleep=600, workers=SMALL))
    kubectl.wait_phase(namespace, name, ("Running",), timeout=120)
    selector = f"disttrain.dev/job-name={name}"
    # Orphan the children: the old pods, Service and ConfigMap stay, with our labels and
    # names but no owner. Nobody says they are this job's: a same-named successor must
    # neither adopt them (counting a restart) nor delete them.
    kubectl.run("delete", JOBS, name, "-n", namespace, "--cascade=orphan", "--wait=true", timeout=60)
    orphans = {c["metadata"]["uid"] for c in kubectl.json("get", "pods,services,configmaps", "-n", namespace,
                                                           "-l", selector)["items"]}
    assert len(orphans) == 4
    kubectl.apply(job_manifest(name, namespace, sleep=600, workers=SMALL))

    def conflict() -> dict[str, Any] | None:
        job = kubectl.job(namespace, name)
        cond = condition(job, "NameConflict")
        return job if cond and cond["status"] == "True" else None

    job = kubectl.wait_for("a NameConflict condition", conflict, timeout=60, interval=1.0)
    cond = condition(job, "NameConflict")
    assert cond is not None and f"{name}-worker-" in cond["message"] and "no controller owner" in cond["message"]
    wait_event(kubectl, namespace, name, "NameConflict")
    left = kubectl.json("get", "pods,services,configmaps", "-n", namespace, "-l", selector)["items"]
    assert {c["metadata"]["uid"] for c in left} == orphans, "an object that is not the job's was touched"
    assert not any(c["metadata"].get("deletionTimestamp") for c in left)
    # The user removes the orphans: the job goes on by itself, with a gang of its own.
    kubectl.run("delete", "pods,services,configmaps", "-n", namespace, "-l", selector, "--wait=false")
    job = kubectl.wait_phase(namespace, name, ("Running",), timeout=180)
    uid = job["metadata"]["uid"]
    pods = kubectl.pods(namespace, name)
    assert {p["metadata"]["uid"] for p in pods}.isdisjoint(orphans), "the new job adopted the old job's pods"
    assert len(pods) == 2 and all(controller_uid(p) == uid for p in pods)
    status = job["status"]
    assert status["restarts"] == 0 and status["attempt"] == 0, status
    assert condition(job, "NameConflict")["status"] == "False"  # type: ignore[index]
    kinds = kubectl.json("get", "services,configmaps", "-n", namespace, "-l", selector)["items"]
    assert {c["kind"] for c in kinds} == {"Service", "ConfigMap"}
    assert all(controller_uid(c) == uid for c in kinds), "the old Service/ConfigMap were kept"


def test_a_helm_service_survives_a_job_of_its_name_and_an_invalid_edit_keeps_the_job_running(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = f"redis-{uuid.uuid4().hex[:5]}"
    helm = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "spec": {"selector": {"app": "redis"}, "ports": [{"port": 6379}]}}
    kubectl.apply(helm)
    before = kubectl.json("get", "service", name, "-n", namespace)["metadata"]
    one = {"replicas": 1, "resources": {"cpu": "100m", "memory": "64Mi"}}
    # backoffLimit 0: a single counted restart would fail the job.
    kubectl.apply(job_manifest(name, namespace, sleep=600, workers=one, runPolicy={"backoffLimit": 0}))

    def has(type_: str, value: str) -> Any:
        def check() -> dict[str, Any] | None:
            job = kubectl.job(namespace, name)
            cond = condition(job, type_)
            return job if cond and cond["status"] == value else None
        return check

    job = kubectl.wait_for("a NameConflict condition", has("NameConflict", "True"), timeout=60, interval=1.0)
    assert f"Service {namespace}/{name} exists, with no controller owner" in condition(job, "NameConflict")["message"]
    wait_event(kubectl, namespace, name, "NameConflict")
    (event,) = [e for e in events(kubectl, namespace, name) if e["reason"] == "NameConflict"]
    assert event["type"] == "Warning" and f"Service {namespace}/{name}" in event["message"]
    assert kubectl.pods(namespace, name) == [] and job["status"]["phase"] == "Pending"
    after = kubectl.json("get", "service", name, "-n", namespace)["metadata"]
    assert (after["uid"], after["resourceVersion"], after.get("ownerReferences")) == (
        before["uid"], before["resourceVersion"], None), "the operator touched the Helm-managed Service"
    # The name frees: the job goes on without anyone touching it.
    kubectl.run("delete", "service", name, "-n", namespace)
    job = kubectl.wait_phase(namespace, name, ("Running",), timeout=120)
    assert condition(job, "NameConflict")["status"] == "False"  # type: ignore[index]
    (pod,) = kubectl.pods(namespace, name)

    # An edit the operator cannot accept: the gang keeps running on the spec it was built from.
    patch = '{"spec": {"workers": {"template": {"hostNetwork": true}}}}'
    kubectl.run("patch", JOBS, name, "-n", namespace, "--type=merge", "-p", patch)
    job = kubectl.wait_for("an InvalidSpec condition", has("InvalidSpec", "True"), timeout=60, interval=1.0)
    assert "spec.workers.template.hostNetwork" in condition(job, "InvalidSpec")["message"]
    assert job["status"]["phase"] == "Running"
    # The fix clears it; the same pod runs on and no restart was counted.
    kubectl.run("patch", JOBS, name, "-n", namespace, "--type=merge",
                "-p", '{"spec": {"workers": {"template": {"hostNetwork": null}}}}')
    job = kubectl.wait_for("InvalidSpec cleared", has("InvalidSpec", "False"), timeout=60, interval=1.0)
    assert job["status"]["phase"] == "Running" and job["status"]["restarts"] == 0 and job["status"]["attempt"] == 0
    (still,) = kubectl.pods(namespace, name)
    assert still["metadata"]["uid"] == pod["metadata"]["uid"] and not still["metadata"].get("deletionTimestamp")
    reasons = [e["reason"] for e in assert_no_repeated_events(kubectl, namespace, name)]
    assert reasons.count("GangCreated") == 1 and "InvalidSpec" in reasons, reasons


def test_children_the_api_server_rejects_are_reported_and_fail_the_job_in_bounded_time(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    # A name that cannot name a Service never reaches the operator: the CRD refuses it.
    proc = kubectl.apply(job_manifest("1job", namespace), check=False)
    assert proc.returncode != 0 and "metadata.name" in proc.stderr, proc.stderr
    # A typo the API server refuses at pod creation (admission: no such PriorityClass).
    name = f"typo-{uuid.uuid4().hex[:5]}"
    one = {"replicas": 1, "resources": {"cpu": "100m", "memory": "64Mi"}}
    obj = job_manifest(name, namespace, sleep=60, workers=one, runPolicy={"childRejectedTimeoutSeconds": 10})
    obj["spec"]["workers"]["template"]["priorityClassName"] = "no-such-class"
    kubectl.apply(obj)

    def rejected() -> dict[str, Any] | None:
        job = kubectl.job(namespace, name)
        cond = condition(job, "ChildRejected")
        return job if cond and cond["status"] == "True" else None

    job = kubectl.wait_for("a ChildRejected condition", rejected, timeout=60, interval=1.0)
    message = condition(job, "ChildRejected")["message"]  # type: ignore[index]
    assert f"Pod {namespace}/{name}-worker-0: HTTP 403" in message and "no-such-class" in message, message
    job = kubectl.wait_phase(namespace, name, ("Failed",), timeout=60)
    failed = condition(job, "Failed")
    assert failed is not None and failed["reason"] == "ChildRejected" and "no-such-class" in failed["message"]
    found = {e["reason"]: e for e in assert_no_repeated_events(kubectl, namespace, name)}
    assert "no-such-class" in found["ChildRejected"]["message"] and found["ChildRejected"]["type"] == "Warning"
    assert kubectl.pods(namespace, name) == []


def test_a_job_deleted_while_no_operator_runs_is_gone_with_its_children(
    kubectl: Kubectl, crd: None, own_namespace: str, tmp_path: Path
) -> None:
    ns = own_namespace
    op = OperatorProcess(kubectl, [ns], tmp_path / "operator.log")
    op.start()
    name = f"orphaned-{uuid.uuid4().hex[:5]}"
    legacy = f"legacy-{uuid.uuid4().hex[:5]}"
    try:
        kubectl.apply(job_manifest(name, ns, sleep=600, workers=SMALL))
        # A job as an earlier operator version left it: with kopf's finalizer.
        old = job_manifest(legacy, ns, sleep=600, workers=SMALL)
        old["metadata"]["finalizers"] = ["disttrain.dev/finalizer"]
        kubectl.apply(old)
        kubectl.wait_phase(ns, name, ("Running",), timeout=120)
        kubectl.wait_for("the operator to drop the legacy finalizer",
                         lambda: not kubectl.job(ns, legacy)["metadata"].get("finalizers"), timeout=60)
        assert not kubectl.job(ns, name)["metadata"].get("finalizers")
    finally:
        op.kill()  # like a crashed operator: nothing cleans up
        print(op.tail())
    start = time.monotonic()
    kubectl.run("delete", JOBS, name, legacy, "-n", ns, "--wait=true", "--timeout=30s", timeout=60)
    assert time.monotonic() - start < 30
    selector = f"disttrain.dev/job-name in ({name},{legacy})"
    kubectl.wait_for("the garbage collector to remove the children", lambda: not [
        p for p in kubectl.json("get", "pods,services,configmaps", "-n", ns, "-l", selector)["items"]
        if not p["metadata"].get("deletionTimestamp")], timeout=90)
