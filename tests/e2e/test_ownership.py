"""Ownership: a job's children are its own only by UID, and deleting a job never needs the
operator (no finalizer)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import Kubectl, OperatorProcess, job_manifest  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)
SMALL = {"replicas": 2, "resources": {"cpu": "100m", "memory": "64Mi"}}
JOBS = "disttrainjobs.disttrain.dev"


def controller_uid(obj: dict[str, Any]) -> str:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return refs[0]["uid"] if refs else ""


def test_a_new_job_with_an_old_name_never_inherits_the_old_pods(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = f"same-{uuid.uuid4().hex[:5]}"
    kubectl.apply(job_manifest(name, namespace, sleep=600, workers=SMALL))
    kubectl.wait_phase(namespace, name, ("Running",), timeout=120)
    old = {p["metadata"]["uid"] for p in kubectl.pods(namespace, name)}
    assert len(old) == 2
    # Orphan the children: the old pods, Service and ConfigMap stay, with our labels and
    # names but no owner: the worst case for a same-named successor.
    kubectl.run("delete", JOBS, name, "-n", namespace, "--cascade=orphan", "--wait=true", timeout=60)
    kubectl.apply(job_manifest(name, namespace, sleep=600, workers=SMALL))
    job = kubectl.wait_phase(namespace, name, ("Running",), timeout=180)
    uid = job["metadata"]["uid"]
    pods = kubectl.pods(namespace, name)
    assert {p["metadata"]["uid"] for p in pods}.isdisjoint(old), "the new job adopted the old job's pods"
    assert len(pods) == 2 and all(controller_uid(p) == uid for p in pods)
    status = job["status"]
    assert status["restarts"] == 0 and status["attempt"] == 0, status
    kinds = kubectl.json("get", "services,configmaps", "-n", namespace, "-l", f"disttrain.dev/job-name={name}")
    assert {c["kind"] for c in kinds["items"]} == {"Service", "ConfigMap"}
    assert all(controller_uid(c) == uid for c in kinds["items"]), "the old Service/ConfigMap were kept"


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
