"""Disruptions (eviction, drain, preemption, a trainer stopped on request) are counted in
status.disruptions and never against runPolicy.backoffLimit; a crash still counts as a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from disttrain_api import model as api
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView, format_time, pod_view

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
RUNNING = {
    "phase": "Running", "attempt": 0, "restarts": 0, "lastSpecReplicas": 2,
    "startTime": format_time(NOW - timedelta(seconds=30)), "observedGeneration": 1,
    "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"},
                   {"type": "Running", "status": "True", "reason": "GangRunning"}],
    # The Secrets a federated or paramserver gang mounts (data mode needs none).
    "secrets": {"identity": "j-identity-0a1b2c3d4e", "tls": "j-tls-0a1b2c3d4e",
                "tlsNotAfter": format_time(NOW + timedelta(days=300))},
}  # fmt: skip


def spec(mode: str = "data", replicas: int = 2, backoff: int = 3) -> api.JobSpec:
    return api.parse_spec({"mode": mode, "workers": {"replicas": replicas}, "runPolicy": {"backoffLimit": backoff}})


def status(replicas: int = 2, **over: Any) -> dict[str, Any]:
    return {**RUNNING, "replicas": replicas, "lastSpecReplicas": replicas, **over}


def raw_pod(index: int, phase: str = "Running", *, exit_code: int | None = None, reason: str = "",
            message: str = "", conditions: list[dict[str, Any]] | None = None, deleting: bool = False,
            attempt: int = 0) -> dict[str, Any]:  # fmt: skip
    """Pod JSON as the API returns it: every signal goes through observe.pod_view."""
    pod_status: dict[str, Any] = {"phase": phase, "conditions": conditions or [], "podIP": f"10.0.0.{index}"}
    if reason:
        pod_status.update(reason=reason, message=message)
    if exit_code is not None:
        pod_status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {
            "exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}}}]
    meta: dict[str, Any] = {
        "name": f"j-worker-{index}", "uid": f"uid-{index}", "creationTimestamp": format_time(NOW - timedelta(seconds=60)),
        "labels": {"disttrain.dev/role": "worker", "disttrain.dev/replica-index": str(index),
                   "disttrain.dev/restart-attempt": str(attempt)},
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = format_time(NOW - timedelta(seconds=2))
    return {"metadata": meta, "status": pod_status}


def views(*pods: dict[str, Any]) -> list[PodView]:
    return [pod_view(p, NOW) for p in pods]


def observed(st: dict[str, Any], pods: list[PodView], s: api.JobSpec | None = None, **kw: Any) -> Observed:
    s = s or spec()
    return Observed(generation=1, spec=s, accepted=s, status=st, pods=pods, now=NOW, **kw)


def reason_of(plan: Any, type_: str) -> str:
    return next(c["reason"] for c in plan.status["conditions"] if c["type"] == type_ and c["status"] == "True")


EVICTED = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
SIGNALS = {
    # Kubernetes >= 1.26 marks every disruption with this condition.
    "disruption-target": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                                          "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}],
                          "deleting": True},
    # Kubernetes 1.20 (the local cluster): a drain or `kubectl delete pod` sets only a deletionTimestamp.
    "deleted-by-someone-else": {"deleting": True},
    "kubelet-eviction": EVICTED,
    "kubelet-preemption": {"phase": "Failed", "reason": "Preempting", "message": "Preempted in order to admit"},
    "node-shutdown": {"phase": "Failed", "reason": "Terminated", "message": "Pod was terminated in response to "
                                                                            "imminent node shutdown."},
    "node-shutdown-newer": {"phase": "Failed", "reason": "Shutdown"},
    # The pod was deleted and SIGTERM reached the trainer (or a peer): it checkpointed its step and
    # exited STOPPED.
    "trainer-stopped": {"phase": "Failed", "exit_code": 3, "deleting": True},
}


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_a_disrupted_gang_restarts_without_counting_a_restart(signal: str) -> None:
    plan = decide(observed(status(), views(raw_pod(0), raw_pod(1, **SIGNALS[signal]))))
    st = plan.status
    assert st["phase"] == "Restarting" and st["attempt"] == 1, st
    assert st["restarts"] == 0 and st["disruptions"] == 1, st
    assert reason_of(plan, "Restarting") == "Disrupted"
    assert plan.delete_pods == ["j-worker-0"] + ([] if SIGNALS[signal].get("deleting") else ["j-worker-1"])
    assert [(t, r) for t, r, _ in plan.events] == [("Normal", "Disrupted")], plan.events
    assert "not counted against runPolicy.backoffLimit" in plan.events[0][2]


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_a_disruption_at_the_backoff_limit_does_not_fail_the_job(signal: str) -> None:
    plan = decide(observed(status(restarts=3), views(raw_pod(0), raw_pod(1, **SIGNALS[signal]))))
    assert plan.status["phase"] == "Restarting" and plan.status["restarts"] == 3
    assert plan.status["disruptions"] == 1


@pytest.mark.parametrize(("exit_code", "reason"), [(1, ""), (137, ""), (1, "OutOfcpu"), (1, "UnexpectedAdmissionError")])
def test_a_crash_still_counts_as_a_restart(exit_code: int, reason: str) -> None:
    plan = decide(observed(status(), views(raw_pod(0), raw_pod(1, "Failed", exit_code=exit_code, reason=reason))))
    assert plan.status["restarts"] == 1 and plan.status["disruptions"] == 0
    assert reason_of(plan, "Restarting") == "WorkerFailed"
    # ... and the limit still fails the job.
    plan = decide(observed(status(restarts=3), views(raw_pod(0), raw_pod(1, "Failed", exit_code=exit_code))))
    assert plan.status["phase"] == "Failed" and reason_of(plan, "Failed") == "BackoffLimitExceeded"


def test_a_running_pod_about_to_be_evicted_does_not_excuse_a_crash_beside_it() -> None:
    target = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
    plan = decide(observed(status(), views(raw_pod(0, conditions=target), raw_pod(1, "Failed", exit_code=1))))
    assert plan.status["restarts"] == 1 and plan.status["disruptions"] == 0


def test_a_pod_the_operator_deleted_itself_is_not_a_disruption() -> None:
    pods = views(raw_pod(0), raw_pod(1, deleting=True))
    plan = decide(observed(status(), pods, deleted_by_operator=frozenset({"uid-1"})))
    assert plan.status["restarts"] == 1 and plan.status["disruptions"] == 0
    assert reason_of(plan, "Restarting") == "WorkerVanished"


def test_peers_that_lost_a_disrupted_pod_belong_to_its_disruption() -> None:
    # Rank 0 was drained and stopped; rank 1 lost its connection mid-stop and exited FAILED.
    plan = decide(observed(status(), views(raw_pod(0, "Failed", exit_code=3, deleting=True),
                                           raw_pod(1, "Failed", exit_code=1))))
    assert plan.status["restarts"] == 0 and plan.status["disruptions"] == 1


@pytest.mark.parametrize("mode", ["data", "paramserver", "federated"])
def test_a_trainer_that_exits_3_by_itself_counts_and_reaches_the_backoff_limit(mode: str) -> None:
    """Nobody deleted the pod and nothing marked it: its own code exited 3 (the stop code). That is
    a failure, or a model that exits 3 would restart forever."""
    s = spec(mode, backoff=1)
    role = "client" if mode == "federated" else "worker"

    def pod(index: int, **kw: Any) -> dict[str, Any]:
        raw = raw_pod(index, **kw)
        raw["metadata"]["labels"]["disttrain.dev/role"] = role
        return raw

    first = decide(observed(status(), views(pod(0), pod(1, phase="Failed", exit_code=3)), s))
    assert first.status["restarts"] == 1 and first.status["disruptions"] == 0, first.status
    assert not any(r == "Disrupted" for _, r, _ in first.events), first.events
    # At the limit: the next exit 3 fails the job.
    again = decide(observed(status(restarts=1), views(pod(0), pod(1, phase="Failed", exit_code=3)), s))
    assert again.status["phase"] == "Failed", again.status
    assert reason_of(again, "Failed") == "BackoffLimitExceeded" and "exit code 3" in again.status["message"]


def test_a_config_error_fails_the_job_even_beside_a_disruption() -> None:
    plan = decide(observed(status(), views(raw_pod(0, "Failed", exit_code=2), raw_pod(1, **EVICTED))))
    assert plan.status["phase"] == "Failed" and reason_of(plan, "Failed") == "TrainerConfigError"


def test_the_disrupted_gang_is_counted_once_and_recreated() -> None:
    plan = decide(observed(status(), views(raw_pod(0), raw_pod(1, deleting=True))))
    st = plan.status
    # The next reconcile sees the old attempt's pods going: nothing more is counted.
    again = decide(observed(st, views(raw_pod(0, deleting=True), raw_pod(1, deleting=True))))
    assert again.status["disruptions"] == 1 and again.status["restarts"] == 0 and not again.create
    gone = decide(observed(again.status, []))
    assert gone.create and gone.status["attempt"] == 1 and gone.status["disruptions"] == 1


def test_a_new_job_reports_zero_disruptions() -> None:
    plan = decide(Observed(generation=1, spec=spec(), status={}, pods=[], now=NOW))
    assert plan.create and plan.status["disruptions"] == 0


# ---------------------------------------------------------------- federated / paramserver: pods replaced alone


def solo(st: dict[str, Any], pods: list[PodView], **kw: Any) -> Any:
    return decide(observed(st, pods, spec("paramserver", replicas=3, backoff=1), **kw))


def test_an_evicted_paramserver_worker_is_replaced_alone_as_a_disruption() -> None:
    plan = solo(status(3, restarts=1), views(raw_pod(0), raw_pod(1, **EVICTED), raw_pod(2)))
    st = plan.status
    assert plan.delete_pods == ["j-worker-1"] and st["attempt"] == 0 and st["phase"] == "Running"
    assert st["restarts"] == 1 and st["disruptions"] == 1 and st["countedPods"] == {"uid-1": "j-worker-1"}
    assert [(t, r) for t, r, _ in plan.events] == [("Normal", "Disrupted")]
    # Terminating: not counted again, even by an operator that restarted (its deletions forgotten).
    going = solo(st, views(raw_pod(0), raw_pod(1, deleting=True, **EVICTED), raw_pod(2)))
    assert going.status["disruptions"] == 1 and going.status["restarts"] == 1 and not going.events
    # Gone: created again; the bookkeeping forgets the pod.
    gone = solo(going.status, views(raw_pod(0), raw_pod(2)))
    assert gone.create and "countedPods" not in gone.status and gone.status["disruptions"] == 1


def test_a_drained_federated_client_counts_once_while_it_goes() -> None:
    fed = api.parse_spec({"mode": "federated", "workers": {"replicas": 2}})
    first = decide(observed(status(), views(raw_pod(0), raw_pod(1, deleting=True)), fed))
    assert first.status["disruptions"] == 1 and first.status["restarts"] == 0 and not first.delete_pods
    assert [(t, r) for t, r, _ in first.events] == [("Normal", "Disrupted")]
    second = decide(observed(first.status, views(raw_pod(0), raw_pod(1, "Failed", exit_code=3, deleting=True)), fed))
    assert second.status["disruptions"] == 1 and not second.events
    gone = decide(observed(second.status, views(raw_pod(0)), fed))
    assert gone.create and gone.status["disruptions"] == 1 and "countedPods" not in gone.status


def test_a_crashed_paramserver_worker_still_counts_and_fails_at_the_limit() -> None:
    plan = solo(status(3), views(raw_pod(0), raw_pod(1, "Failed", exit_code=1), raw_pod(2)))
    assert plan.status["restarts"] == 1 and plan.status["disruptions"] == 0
    assert [(t, r) for t, r, _ in plan.events] == [("Warning", "WorkerReplaced")]
    plan = solo(status(3, restarts=1), views(raw_pod(0), raw_pod(1, "Failed", exit_code=1), raw_pod(2)))
    assert plan.status["phase"] == "Failed"
