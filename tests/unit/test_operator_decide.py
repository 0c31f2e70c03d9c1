"""The reconciler's decisions (decide.py) from status + pods, without a cluster."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from disttrain_api import model as api
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView, format_time

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def spec(**over: Any) -> api.JobSpec:
    base: dict[str, Any] = {"mode": "data", "workers": {"replicas": 2}}
    base.update(over)
    return api.parse_spec(base)


def pod(index: int, phase: str = "Running", attempt: int = 0, **kw: Any) -> PodView:
    values: dict[str, Any] = {"name": f"j-worker-{index}", "role": "worker", "index": index, "attempt": attempt,
                              "phase": phase, "scheduled": phase != "Pending", "ip": f"10.0.0.{index}"}
    values.update(kw)
    return PodView(**values)


def obs(status: dict[str, Any] | None = None, pods: list[PodView] | None = None, **kw: Any) -> Observed:
    values: dict[str, Any] = {"generation": 1, "spec": spec(), "status": status or {}, "pods": pods or [], "now": NOW}
    values.update(kw)
    if "accepted" not in values:
        values["accepted"] = values["spec"] if status else None
    return Observed(**values)


def cond(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status["conditions"] if c["type"] == type_), None)


RUNNING_STATUS = {
    "phase": "Running", "attempt": 0, "replicas": 2, "restarts": 0, "lastSpecReplicas": 2,
    "startTime": format_time(NOW - timedelta(seconds=30)), "observedGeneration": 1,
    "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"},
                   {"type": "Running", "status": "True", "reason": "GangRunning"}],
}


def test_new_job_creates_the_gang() -> None:
    plan = decide(obs())
    assert plan.create and not plan.delete_pods
    st = plan.status
    assert st["phase"] == "Pending" and st["attempt"] == 0 and st["replicas"] == 2 and st["restarts"] == 0
    assert st["observedGeneration"] == 1
    assert cond(st, "Created")["status"] == "True"
    assert ("Normal", "GangCreated") in [(t, r) for t, r, _ in plan.events]


def test_restarted_operator_adopts_running_gang_without_creating() -> None:
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1)], progress={"disttrain_step": 120.0,
                                                                         "disttrain_last_checkpoint_step": 100.0}))
    assert not plan.create and not plan.delete_pods and not plan.events
    assert plan.status["phase"] == "Running"
    assert plan.status["step"] == 120 and plan.status["lastCheckpointStep"] == 100
    assert plan.status["workers"] == {"active": 2, "pending": 0, "succeeded": 0, "failed": 0}


def test_all_running_moves_to_running_with_start_time() -> None:
    st = {**RUNNING_STATUS, "phase": "Pending"}
    del st["startTime"]
    plan = decide(obs(st, [pod(0), pod(1)]))
    assert plan.status["phase"] == "Running" and plan.status["startTime"] == format_time(NOW)


def test_failed_worker_restarts_gang_with_next_attempt() -> None:
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0, "Failed", exit_code=1, message="boom"), pod(1)]))
    st = plan.status
    assert st["phase"] == "Restarting" and st["restarts"] == 1 and st["attempt"] == 1
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"] and not plan.create
    assert cond(st, "Restarting")["reason"] == "WorkerFailed"
    assert "boom" in cond(st, "Restarting")["message"]
    assert any(t == "Warning" and r == "WorkerFailed" for t, r, _ in plan.events)


def test_the_restart_blames_the_killed_worker_not_the_peer_that_lost_its_connection() -> None:
    # Worker 0 failed on its connection to worker 1, which the OOM killer (or a kill -9) ended:
    # the message names worker 1 and the signal, not worker 0's gloo error or worker 1's last log line.
    plan = decide(obs(dict(RUNNING_STATUS), [
        pod(0, "Failed", exit_code=1, message="RuntimeError: Connection reset by peer"),
        pod(1, "Failed", exit_code=137, message="step 40/100 loss 0.31")]))  # fmt: skip
    msg = cond(plan.status, "Restarting")["message"]
    assert msg.startswith("pod j-worker-1 was killed by SIGKILL (exit code 137); its last line: step 40/100"), msg


def test_a_restart_keeps_the_rate_but_not_the_window_of_the_gang_it_replaces() -> None:
    progress = {"completed": 120, "total": 500, "unit": "steps", "percent": 24.0, "rate": 2.0,
                "lastUpdateTime": format_time(NOW - timedelta(seconds=5))}  # fmt: skip
    plan = decide(obs({**RUNNING_STATUS, "progress": progress}, [pod(0, "Failed", exit_code=1), pod(1)]))
    st = plan.status
    assert st["phase"] == "Restarting" and st["progress"]["rate"] == 2.0
    assert "lastUpdateTime" not in st["progress"]  # the new gang's first reading starts the next window


def test_restart_waits_for_old_pods_then_recreates() -> None:
    st = {**RUNNING_STATUS, "phase": "Restarting", "attempt": 1, "restarts": 1}
    old = [pod(0, "Failed", deleting=True, deleting_for_s=2), pod(1, deleting=True, deleting_for_s=2)]
    plan = decide(obs(st, old))
    assert not plan.create and not plan.delete_pods and not plan.force_delete_pods
    stuck = [pod(0, deleting=True, deleting_for_s=99)]
    assert decide(obs(st, stuck)).force_delete_pods == ["j-worker-0"]
    # A pod whose containers have all stopped runs nothing: the next gang does not wait for its
    # kubelet to remove its sandbox (up to a minute on a 1.20 kubelet).
    stopped = [pod(0, "Failed", deleting=True, deleting_for_s=2, stopped=True), pod(1, deleting=True, deleting_for_s=2)]
    assert decide(obs(st, stopped)).force_delete_pods == ["j-worker-0"]
    plan = decide(obs(st, []))
    assert plan.create and plan.status["attempt"] == 1 and plan.status["restarts"] == 1
    assert plan.status["phase"] == "Pending"
    # Stale status (operator restarted after creating pods, before patching): same attempt, no new count.
    plan = decide(obs(st, [pod(0, attempt=1), pod(1, attempt=1)]))
    assert plan.status["restarts"] == 1 and plan.status["attempt"] == 1


def test_backoff_limit_then_failed() -> None:
    st = {**RUNNING_STATUS, "restarts": 3}
    plan = decide(obs(st, [pod(0, "Failed", exit_code=1), pod(1)]))
    assert plan.status["phase"] == "Failed" and plan.status["restarts"] == 3
    assert cond(plan.status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert plan.delete_pods == ["j-worker-1"] and "completionTime" in plan.status


def test_config_error_exit_code_fails_without_retry() -> None:
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0, "Failed", exit_code=2, message="mode x not implemented"), pod(1)]))
    assert plan.status["phase"] == "Failed" and plan.status["restarts"] == 0
    assert cond(plan.status, "Failed")["reason"] == "TrainerConfigError"


def test_vanished_and_lost_node_restart() -> None:
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0)]))
    assert plan.status["phase"] == "Restarting" and cond(plan.status, "Restarting")["reason"] == "WorkerVanished"
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1, not_ready_for_s=60)], node_lost_after_s=15.0))
    assert cond(plan.status, "Restarting")["reason"] == "NodeLost"
    assert plan.force_delete_pods == ["j-worker-1"]


def test_a_node_counts_as_lost_after_kubernetes_own_eviction_timeout_by_default() -> None:
    """300 s, the pod-eviction default: a pod NotReady for a minute is not replaced (its node may be
    back soon, and its process may still run); a shorter timeout is the operator's setting."""
    assert Observed.__dataclass_fields__["node_lost_after_s"].default == 300.0
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1, not_ready_for_s=60)]))
    assert plan.status["phase"] == "Running" and not plan.force_delete_pods
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1, not_ready_for_s=300)]))
    assert cond(plan.status, "Restarting")["reason"] == "NodeLost"


def test_success_copies_rank0_summary() -> None:
    msg = '{"steps": 400, "testAccuracy": 0.97, "resumedFromStep": 0}'
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0, "Succeeded", exit_code=0, message=msg), pod(1, "Succeeded")]))
    st = plan.status
    assert st["phase"] == "Succeeded" and st["result"]["testAccuracy"] == 0.97 and st["step"] == 400
    assert "0.97" in cond(st, "Succeeded")["message"] and st["completionTime"]


def test_finished_job_cleanup_and_ttl() -> None:
    done = {**RUNNING_STATUS, "phase": "Succeeded", "completionTime": format_time(NOW - timedelta(seconds=20))}
    pods = [pod(0, "Succeeded"), pod(1, "Running")]
    assert decide(obs(done, pods)).delete_pods == ["j-worker-1"]
    s_all = spec(runPolicy={"cleanPodPolicy": "All", "ttlSecondsAfterFinished": 10})
    plan = decide(obs(done, pods, spec=s_all, accepted=s_all))
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"] and plan.delete_job
    s_none = spec(runPolicy={"cleanPodPolicy": "None", "ttlSecondsAfterFinished": 60})
    plan = decide(obs(done, pods, spec=s_none, accepted=s_none))
    assert plan.delete_pods == [] and not plan.delete_job


def test_invalid_spec_condition_and_no_pods() -> None:
    plan = decide(obs(spec=None, spec_error="spec.parallelism.tensor: 3 does not divide world size 2"))
    assert not plan.create and plan.status["phase"] == "Failed"
    c = cond(plan.status, "InvalidSpec")
    assert c["status"] == "True" and "spec.parallelism.tensor" in c["message"]


def test_immutable_change_refused_keeps_running() -> None:
    new = spec(model={"name": "cnn"})
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1)], spec=new, accepted=spec(), generation=2))
    c = cond(plan.status, "InvalidSpec")
    assert c["reason"] == "ImmutableFieldChanged" and "spec.model" in c["message"]
    assert plan.status["phase"] == "Running" and not plan.delete_pods
    assert plan.spec is not None and plan.spec.model.name == "mlp"


def test_suspend_then_resume() -> None:
    sus = spec(runPolicy={"suspend": True})
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1)], spec=sus, accepted=sus))
    assert plan.status["phase"] == "Suspended" and sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"]
    st = plan.status
    # A pod whose kubelet does not confirm its termination is force-deleted after a while.
    stuck = [pod(0, deleting=True, deleting_for_s=5.0), pod(1, deleting=True, deleting_for_s=60.0)]
    plan = decide(obs(st, stuck, spec=sus, accepted=sus))
    assert plan.status["phase"] == "Suspended" and plan.force_delete_pods == ["j-worker-1"] and not plan.delete_pods
    plan = decide(obs(st, [pod(0, deleting=True)]))  # resume, old pods still terminating
    assert not plan.create and plan.status["phase"] == "Suspended"
    plan = decide(obs(st, []))
    assert plan.create and plan.status["attempt"] == 1 and plan.status["restarts"] == 0
    assert cond(plan.status, "Suspended")["status"] == "False"
    assert [r for _, r, _ in plan.events] == ["Resumed", "GangCreated"]


def test_unschedulable_stays_pending_with_condition() -> None:
    st = {**RUNNING_STATUS, "phase": "Pending"}
    pods = [pod(0, "Pending", unschedulable_message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                age_s=500), pod(1, "Pending", unschedulable_message="x", age_s=500)]
    plan = decide(obs(st, pods))
    assert plan.status["phase"] == "Pending" and not plan.delete_pods
    c = cond(plan.status, "Running")
    assert c["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in c["message"]


def test_elastic_shrink_after_timeout() -> None:
    s = spec(workers={"replicas": 4}, elastic={"minReplicas": 2, "maxReplicas": 4, "scheduleTimeoutSeconds": 30})
    st = {**RUNNING_STATUS, "phase": "Pending", "replicas": 4, "lastSpecReplicas": 4}
    pods = [pod(0), pod(1), pod(2, "Pending", unschedulable_message="Insufficient cpu", age_s=10),
            pod(3, "Pending", unschedulable_message="Insufficient cpu", age_s=10)]
    assert decide(obs(st, pods, spec=s, accepted=s)).status["phase"] == "Pending"
    pods = [p if p.index < 2 else pod(p.index, "Pending", unschedulable_message="Insufficient cpu", age_s=31)
            for p in pods]
    plan = decide(obs(st, pods, spec=s, accepted=s))
    assert plan.status["replicas"] == 2 and plan.status["attempt"] == 1 and plan.status["restarts"] == 0
    assert cond(plan.status, "Restarting")["reason"] == "ElasticShrink" and len(plan.delete_pods) == 4


def test_elastic_jobs_do_not_shrink_while_their_claim_is_unbound() -> None:
    s = spec(workers={"replicas": 2}, elastic={"minReplicas": 1, "maxReplicas": 2, "scheduleTimeoutSeconds": 5})
    st = {**RUNNING_STATUS, "phase": "Pending", "replicas": 2, "lastSpecReplicas": 2}
    why = "0/2 nodes are available: 2 pod has unbound immediate PersistentVolumeClaims."
    pods = [pod(0, "Pending", unschedulable_message=why, age_s=60), pod(1, "Pending", unschedulable_message=why,
                                                                        age_s=60)]  # fmt: skip
    plan = decide(obs(st, pods, spec=s, accepted=s))
    assert plan.status["replicas"] == 2 and plan.status["attempt"] == 0 and not plan.delete_pods
    assert cond(plan.status, "Running")["reason"] == "Unschedulable" and "PersistentVolumeClaims" in plan.status["message"]


def test_replicas_change_within_elastic_range_resizes() -> None:
    s = spec(workers={"replicas": 3}, elastic={"minReplicas": 1, "maxReplicas": 4})
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1)], spec=s, accepted=s, generation=2))
    assert plan.status["replicas"] == 3 and plan.status["attempt"] == 1
    assert cond(plan.status, "Restarting")["reason"] == "Resized"
    s = spec(workers={"replicas": 3})  # no elastic: refused
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1)], spec=s, accepted=s, generation=2))
    assert plan.status["replicas"] == 2 and cond(plan.status, "InvalidSpec")["reason"] == "ImmutableFieldChanged"


def test_active_deadline() -> None:
    s = spec(runPolicy={"activeDeadlineSeconds": 10})
    plan = decide(obs(dict(RUNNING_STATUS), [pod(0), pod(1)], spec=s, accepted=s))
    assert plan.status["phase"] == "Failed" and cond(plan.status, "Failed")["reason"] == "DeadlineExceeded"
    assert len(plan.delete_pods) == 2


def test_only_the_clock_dependent_cases_ask_for_a_recheck() -> None:
    from disttrain_operator.decide import needs_recheck

    def recheck(o: Observed) -> bool:
        return needs_recheck(o, decide(o))

    assert not recheck(obs(dict(RUNNING_STATUS), [pod(0), pod(1)]))  # healthy: the next event will do
    deadline = spec(runPolicy={"activeDeadlineSeconds": 3600})
    started = {**RUNNING_STATUS, "startTime": format_time(NOW - timedelta(seconds=5))}
    assert recheck(obs(started, [pod(0), pod(1)], spec=deadline, accepted=deadline))
    assert recheck(obs(dict(RUNNING_STATUS), [pod(0), pod(1, not_ready_for_s=3.0)]))  # node-lost timeout
    terminating = [pod(0), pod(1, deleting=True, deleting_for_s=5.0)]
    assert recheck(obs(dict(RUNNING_STATUS), terminating))  # force delete after a while
    done = {**RUNNING_STATUS, "phase": "Succeeded", "completionTime": format_time(NOW - timedelta(seconds=5))}
    assert not recheck(obs(done, [pod(0, "Succeeded"), pod(1, "Succeeded")]))
    ttl = spec(runPolicy={"ttlSecondsAfterFinished": 600})
    assert recheck(obs(done, [], spec=ttl, accepted=ttl))
    expired = spec(runPolicy={"ttlSecondsAfterFinished": 1})
    assert not recheck(obs(done, [], spec=expired, accepted=expired))  # deleted now: nothing left to wait for
    assert not recheck(obs({}, [], spec=None, spec_error="bad"))


def test_image_pull_error_is_surfaced() -> None:
    st = {**RUNNING_STATUS, "phase": "Pending"}
    pods = [pod(0, "Pending", reason="ErrImagePull", message="pull access denied for nope:1"), pod(1, "Pending")]
    plan = decide(obs(st, pods))
    assert plan.status["phase"] == "Pending" and "nope:1" in plan.status["message"]
    assert cond(plan.status, "Running")["reason"] == "ErrImagePull"


def test_elastic_shrink_skips_sizes_where_the_spec_breaks() -> None:
    # batch 64 over 3 ranks does not split: 3 scheduled pods of 4 shrink to 2, never 3.
    s = spec(workers={"replicas": 4}, data={"batchSize": 64},
             elastic={"minReplicas": 1, "maxReplicas": 4, "scheduleTimeoutSeconds": 30})
    st = {**RUNNING_STATUS, "phase": "Pending", "replicas": 4, "lastSpecReplicas": 4}
    pods = [pod(0), pod(1), pod(2), pod(3, "Pending", unschedulable_message="Insufficient cpu", age_s=31)]
    plan = decide(obs(st, pods, spec=s, accepted=s))
    assert plan.status["replicas"] == 2 and cond(plan.status, "Restarting")["reason"] == "ElasticShrink"
    assert "shrinking to 2 replicas" in cond(plan.status, "Restarting")["message"]


def test_elastic_shrink_waits_when_no_smaller_size_is_valid() -> None:
    s = spec(mode="tensor", workers={"replicas": 2}, parallelism={"tensor": 2},
             model={"name": "gpt", "hidden": 128, "heads": 4}, data={"name": "pytext", "batchSize": 64},
             elastic={"minReplicas": 1, "maxReplicas": 2, "scheduleTimeoutSeconds": 30})
    st = {**RUNNING_STATUS, "phase": "Pending"}
    pods = [pod(0), pod(1, "Pending", unschedulable_message="Insufficient cpu", age_s=300)]
    plan = decide(obs(st, pods, spec=s, accepted=s))
    assert plan.status["replicas"] == 2 and plan.status["attempt"] == 0 and not plan.delete_pods
    assert cond(plan.status, "Running")["reason"] == "Unschedulable"


def test_pods_of_an_earlier_job_with_the_same_name_are_left_to_the_garbage_collector() -> None:
    # A new job (no status) whose name an earlier, deleted job used: its pods still exist
    # with the earlier job's UID. They are never adopted, counted or deleted by the operator
    # (the garbage collector deletes them with their owner) and block the new gang.
    old = [pod(0, owner_uid="old-uid", owner_kind="DistTrainJob", owner_name="j", attempt=3),
           pod(1, owner_uid="old-uid", owner_kind="DistTrainJob", owner_name="j", attempt=3, deleting=True,
               deleting_for_s=5)]
    plan = decide(obs(None, old, uid="new-uid", name="j"))
    assert not plan.create and not plan.delete_pods and not plan.force_delete_pods
    st = plan.status
    assert st["phase"] == "Pending" and st["attempt"] == 0 and st["restarts"] == 0
    assert "garbage collector" in st["message"] and "j-worker-0" in st["message"]
    assert not plan.events and cond(st, "NameConflict") is None
    # one its node cannot confirm deleted is force-deleted, as the job's own would be
    stuck = [old[0], dataclasses.replace(old[1], deleting_for_s=60)]
    assert decide(obs(None, stuck, uid="new-uid", name="j")).force_delete_pods == ["j-worker-1"]
    # once they are gone, the gang is created at attempt 0
    plan = decide(obs(plan.status, [], uid="new-uid", accepted=None))
    assert plan.create and plan.status["attempt"] == 0


def test_pods_with_the_jobs_label_that_are_not_its_own_are_a_name_conflict() -> None:
    # An orphan (no controller) or another owner's pod carrying the job's label would take
    # a worker's name and DNS record: the job waits with NameConflict, and the pod is left alone.
    orphan = pod(0, attempt=0)
    other = pod(1, owner_uid="rs-uid", owner_kind="ReplicaSet", owner_name="web-5d9")
    plan = decide(obs(None, [orphan, other], uid="new-uid", name="j"))
    assert not plan.create and not plan.delete_pods and not plan.force_delete_pods
    c = cond(plan.status, "NameConflict")
    assert c["status"] == "True" and "Pod j-worker-0" in c["message"] and "no controller owner" in c["message"]
    assert "ReplicaSet web-5d9" in c["message"]
    assert [(t, r) for t, r, _ in plan.events] == [("Warning", "NameConflict")]
    again = decide(obs(plan.status, [orphan, other], uid="new-uid", name="j", accepted=None))
    assert not again.events and not again.create  # still waiting: no second Event
    freed = decide(obs(again.status, [], uid="new-uid", name="j", accepted=None))
    assert freed.create and cond(freed.status, "NameConflict")["status"] == "False"


def test_pods_that_only_copy_the_jobs_labels_do_not_block_its_creation() -> None:
    # Same namespace, the job's labels (role, index, attempt), but other names: nothing they hold
    # is a name the gang needs, so the gang is created, and they are neither adopted nor deleted.
    copies = [pod(0, name="copy-a", attempt=0),
              pod(1, name="copy-b", owner_uid="rs-uid", owner_kind="ReplicaSet", owner_name="web-5d9"),
              pod(5, name="j-worker-5")]  # beyond the gang's two pods
    plan = decide(obs(None, copies, uid="new-uid", name="j"))
    assert plan.create and not plan.delete_pods and not plan.force_delete_pods, plan.status
    assert cond(plan.status, "NameConflict") is None and cond(plan.status, "Created")["status"] == "True"  # type: ignore[index]
    assert not any(r == "NameConflict" for _, r, _ in plan.events)
    # A federated job's gang are its clients: a copy named like a worker holds none of their names.
    fed = api.parse_spec({"mode": "federated", "workers": {"replicas": 2}})
    free = decide(obs(None, [pod(0)], uid="new-uid", name="j", spec=fed))
    assert free.mint_secrets == ("identity", "tls") and cond(free.status, "NameConflict") is None
    held = decide(obs(None, [pod(0, name="j-client-0")], uid="new-uid", name="j", spec=fed))
    assert not held.mint_secrets and cond(held.status, "NameConflict")["status"] == "True"  # type: ignore[index]


def test_foreign_pods_beside_a_running_gang_are_never_counted_or_deleted() -> None:
    ours = [pod(0, owner_uid="me"), pod(1, owner_uid="me")]
    orphan = pod(2, "Failed", exit_code=1, attempt=7)  # no controller at all
    other = pod(3, owner_uid="rs-uid", owner_kind="ReplicaSet")  # someone else's
    stuck = pod(4, owner_uid="old", owner_kind="DistTrainJob", deleting=True, deleting_for_s=60)
    plan = decide(obs(dict(RUNNING_STATUS), [*ours, orphan, other, stuck], uid="me"))
    st = plan.status
    assert st["phase"] == "Running" and st["restarts"] == 0 and st["attempt"] == 0
    assert st["workers"] == {"active": 2, "pending": 0, "succeeded": 0, "failed": 0}
    assert plan.delete_pods == [] and plan.force_delete_pods == ["j-worker-4"]


def test_an_invalid_edit_keeps_the_gang_running_and_the_fix_restarts_nothing() -> None:
    # Restarts already at runPolicy.backoffLimit (3): one more counted restart fails the job.
    st = {**RUNNING_STATUS, "restarts": 3}
    gang = [pod(0), pod(1)]
    err = "spec.workers.template.hostNetwork: not allowed in workers.template"
    plan = decide(obs(dict(st), gang, spec=None, spec_error=err, accepted=spec(), generation=2))
    assert plan.status["phase"] == "Running" and not plan.delete_pods and not plan.create
    c = cond(plan.status, "InvalidSpec")
    assert c["status"] == "True" and c["reason"] == "InvalidSpec" and "hostNetwork" in c["message"]
    assert [(t, r) for t, r, _ in plan.events] == [("Warning", "InvalidSpec")]
    assert plan.spec == spec()  # the gang's own spec goes on
    again = decide(obs(plan.status, gang, spec=None, spec_error=err, accepted=spec(), generation=2))
    assert not again.events and again.status["phase"] == "Running" and not again.delete_pods
    fixed = decide(obs(again.status, gang, spec=spec(), accepted=spec(), generation=3))
    assert cond(fixed.status, "InvalidSpec")["status"] == "False"
    assert fixed.status["phase"] == "Running" and fixed.status["restarts"] == 3 and fixed.status["attempt"] == 0
    assert not fixed.delete_pods and not fixed.create and not fixed.events
    # A worker failing meanwhile restarts the gang as usual, from the accepted spec.
    failed = decide(obs({**plan.status, "restarts": 0}, [pod(0), pod(1, "Failed", exit_code=1)], spec=None,
                        spec_error=err, accepted=spec(), generation=2))
    assert failed.status["phase"] == "Restarting" and failed.spec == spec()


def test_an_invalid_edit_keeps_the_size_the_user_asked_for() -> None:
    # An elastic job shrunk to 2 of 4: its ConfigMap says 2, the user's last valid spec 4.
    el = {"minReplicas": 1, "maxReplicas": 4}
    asked = spec(workers={"replicas": 4}, elastic=el, data={"batchSize": 64})
    shrunk = spec(workers={"replicas": 2}, elastic=el, data={"batchSize": 64})
    st = {**RUNNING_STATUS, "lastSpecReplicas": 4}
    plan = decide(obs(dict(st), [pod(0), pod(1)], spec=None, spec_error="spec.x: bad", accepted=shrunk))
    assert plan.status["lastSpecReplicas"] == 4 and plan.status["replicas"] == 2 and not plan.delete_pods
    fixed = decide(obs(plan.status, [pod(0), pod(1)], spec=asked, accepted=shrunk, generation=3))
    assert fixed.status["phase"] == "Running" and not fixed.delete_pods and fixed.status["attempt"] == 0


def test_a_job_that_never_had_a_valid_spec_fails_at_once() -> None:
    plan = decide(obs({"phase": "Pending"}, [], spec=None, spec_error="spec.x: bad", accepted=None))
    assert plan.status["phase"] == "Failed" and cond(plan.status, "InvalidSpec")["status"] == "True"
