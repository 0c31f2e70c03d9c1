"""Two operator replicas with leader election: one active, one standing by; killing the
active one hands over within 15 s, with no duplicate pods and no lost or doubled counts."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from .conftest import (  # type: ignore[import-not-found]
    Kubectl,
    OperatorProcess,
    assert_no_repeated_events,
    job_manifest,
)

pytestmark = pytest.mark.timeout(600)
HANDOVER_S = 15.0
SMALL = {"replicas": 2, "resources": {"cpu": "100m", "memory": "64Mi"}}


def holder(kubectl: Kubectl, ns: str) -> str:
    out = kubectl.run("get", "lease", "disttrain-operator", "-n", ns, "-o", "jsonpath={.spec.holderIdentity}",
                      check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


def test_standby_replica_takes_over_when_the_active_one_is_killed(
    kubectl: Kubectl, crd: None, own_namespace: str, tmp_path: Path
) -> None:
    ns = own_namespace
    elect = ("--leader-elect", "--lease-namespace", ns)
    first = OperatorProcess(kubectl, [ns], tmp_path / "first.log", extra=elect)
    second = OperatorProcess(kubectl, [ns], tmp_path / "second.log", extra=elect)
    first.start()
    try:
        kubectl.wait_for("the first replica to hold the lease", lambda: holder(kubectl, ns), timeout=60, interval=0.5)
        second.start()
        name = f"standby-{uuid.uuid4().hex[:5]}"
        kubectl.apply(job_manifest(name, ns, sleep=600, workers=SMALL))
        kubectl.wait_phase(ns, name, ("Running",), timeout=120)
        active_id = holder(kubectl, ns)
        active, standby = (first, second) if active_id.endswith(f"-{first.proc.pid}") else (second, first)  # type: ignore[union-attr]
        assert active_id.endswith(f"-{active.proc.pid}"), active_id  # type: ignore[union-attr]
        # The standby does nothing while the other holds the lease.
        assert "holding lease" not in standby.log.read_text(errors="replace")
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, name)}
        assert len(before) == 2

        active.kill()
        killed = time.monotonic()
        fresh = f"after-{uuid.uuid4().hex[:5]}"
        kubectl.apply(job_manifest(fresh, ns, sleep=600, workers=SMALL))
        new_id = kubectl.wait_for("the standby to take the lease",
                                  lambda: (h := holder(kubectl, ns)) and h != active_id and h,
                                  timeout=60, interval=0.5)
        took_lease = time.monotonic() - killed
        kubectl.wait_for("the job created meanwhile to get its pods",
                         lambda: len(kubectl.pods(ns, fresh)) == 2, timeout=60, interval=0.5)
        took_pods = time.monotonic() - killed
        print(f"handover: lease after {took_lease:.1f}s, pods of the new job after {took_pods:.1f}s")
        assert new_id.endswith(f"-{standby.proc.pid}")  # type: ignore[union-attr]
        assert took_lease <= HANDOVER_S and took_pods <= HANDOVER_S + 5, (took_lease, took_pods)

        kubectl.wait_phase(ns, fresh, ("Running",), timeout=120)
        time.sleep(4)  # a few progress intervals of the new active replica
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, name)}
        assert after == before, "the new active replica recreated or duplicated pods"
        job = kubectl.job(ns, name)
        assert job["status"]["phase"] == "Running" and job["status"].get("restarts", 0) == 0
        assert_no_repeated_events(kubectl, ns, name)
        assert_no_repeated_events(kubectl, ns, fresh)
    finally:
        first.stop()
        second.stop()
        print(first.tail(), second.tail())
