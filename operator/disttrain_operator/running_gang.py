"""The reconciler's decision once the gang of the current attempt exists: a failed, vanished or
lost pod restarts the gang (counted against runPolicy.backoffLimit unless a disruption caused it)
or, in modes whose workers never wait for each other, is replaced alone; a permanent failure or
the backoff limit fails the job; unschedulable pods wait or shrink an elastic gang; all pods
Succeeded is the job's success; all running is Running, with rank 0's progress.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from typing import Any

from disttrain_api import exitcodes
from disttrain_api import metric_names as names
from disttrain_api import progress as job_progress
from disttrain_api.model import JobSpec
from disttrain_api.scaling import hint as scaling
from disttrain_api.validation import valid_sizes

from . import checkpoint_status, job_secrets, replica_groups
from .decision import (
    DISRUPTED,
    FAILED,
    PENDING,
    RUNNING,
    SECRETS_RENEWED,
    SUCCEEDED,
    Observed,
    Plan,
    StatusBuilder,
    restart,
    stuck,
)
from .observe import PodView, format_time, parse_summary
from .progress import FORECAST
from .topology.credentials import TLS

# Exit code 2 is the trainer's "configuration error / mode not implemented": retrying cannot help.
PERMANENT_EXIT_CODES = exitcodes.PERMANENT
# Modes without gang restart: a failed worker (paramserver) or client (federated) pod is replaced
# alone while the others go on; its Deployment restarts a server.
SOLO_REPLACE_MODES = ("paramserver", "federated")
# The Event that carries a new status.hint.
HINT_REASON = "ScalingHint"


def decide_running(b: StatusBuilder, finish: Callable[..., Plan], plan: dict[str, Any], obs: Observed, *,
                   spec: JobSpec, pods: list[PodView], current: list[PodView], live: list[PodView], attempt: int,
                   replicas: int, restarts: int, phase: str) -> Plan:  # fmt: skip
    """The gang of this attempt exists: failed / vanished / unschedulable / running / done."""
    st = b.status
    if renew := job_secrets.due(spec, st, obs.now, obs.tls_renew_before_s):
        # Pods and servers mount Secrets by name at their start: new ones need new pods (job_secrets.py).
        expires = (st.get("secrets") or {}).get(job_secrets.NOT_AFTER)
        why = (f"the TLS certificate expires at {expires}" if job_secrets.recorded(st).get(TLS) and TLS in renew
               else "the job's Secrets are not recorded in its status (an earlier operator version made them)")
        msg = (f"{why}: recreating the gang and its servers on new {', '.join(renew)} Secrets "
               "(not counted against runPolicy.backoffLimit)")
        return dataclasses.replace(restart(b, st, plan, current, pods, attempt + 1, replicas, SECRETS_RENEWED, msg,
                                           count=False), delete_servers=True)  # fmt: skip
    gang = {p.index: p for p in current}
    missing = [i for i in range(replicas) if i not in gang]
    reasons = first_cause([r for p in current if (r := failure(p, obs.node_lost_after_s))])
    if spec.fault_tolerant:
        replica_groups.update(b, spec, current, obs, failure)
    if missing:
        reasons.append(f"worker pod(s) {missing} vanished")
    if reasons:
        permanent = [p for p in current if p.exit_code in PERMANENT_EXIT_CODES]
        limit = spec.run_policy.backoff_limit
        # A disrupted pod is counted in status.disruptions, never against backoffLimit. In a gang
        # its peers fail with it (they stop at the step it stopped at, or lose their connection
        # to it): the whole restart is the disruption's.
        disrupted = [d for p in current if (d := disruption(p, obs))]
        solo = spec.mode in SOLO_REPLACE_MODES or (spec.fault_tolerant and replica_groups.replace_alone(
            spec, current, obs, failure))  # fault-tolerant replicas: while minReplicas others train on
        if solo and not permanent and (
            restarts < limit or not any(not p.deleting and failure(p, obs.node_lost_after_s)
                                        and not disruption(p, obs) for p in current)
        ):  # below the limit, or only disruptions and finishing replacements already counted
            return _replace_alone(b, st, finish, current, missing, restarts, obs,
                                  replica=spec.fault_tolerant)  # fmt: skip
        if spec.fault_tolerant:
            replica_groups.forget_quorum(st)  # below minReplicas (or the limit): the gang restarts
        if disrupted and not permanent and spec.mode not in SOLO_REPLACE_MODES:
            st["disruptions"] = int(st.get("disruptions") or 0) + 1
            return restart(b, st, plan, current, pods, attempt + 1, replicas, DISRUPTED,
                            f"{disrupted[0]}; restarting the gang from its checkpoint (a disruption: not counted "
                            f"against runPolicy.backoffLimit)", count=False,
                            force=stuck(current, obs) + [p.name for p in current if p.not_ready_for_s > 0])
        if permanent or restarts >= limit:
            why = "TrainerConfigError" if permanent else "BackoffLimitExceeded"
            msg = reasons[0] if permanent else f"{reasons[0]}; {restarts} restarts reached runPolicy.backoffLimit={limit}"
            b.condition("Failed", True, why, msg)
            b.condition("Running", False, why, msg)
            b.phase(FAILED, msg)
            st["completionTime"] = format_time(obs.now)
            return finish(delete_pods=[p.name for p in live], delete_servers=True)
        kind = "NodeLost" if "lost its node" in reasons[0] else ("WorkerVanished" if "vanished" in reasons[0]
                                                                  or "deleted" in reasons[0] else "WorkerFailed")
        return restart(b, st, plan, current, pods, attempt + 1, replicas, kind,
                        f"{reasons[0]}; restarting the gang from the last checkpoint", count=True,
                        force=stuck(current, obs) + [p.name for p in current if p.not_ready_for_s > 0])

    if all(p.phase == "Succeeded" for p in current):
        result = parse_summary(gang[0].message) if 0 in gang else None
        msg = "training finished"
        if result and isinstance(result.get("device"), str):
            msg += f" on {result['device']}"
        if result and isinstance(result.get("testAccuracy"), int | float):
            msg += f": test accuracy {result['testAccuracy']:.4f}"
        if result is not None:
            st["result"] = result
            for key, target in (("steps", "step"),):
                if isinstance(result.get(key), int | float):
                    st[target] = int(result[key])
            if isinstance(result.get("commFraction"), int | float):
                st["commFraction"] = round(float(result["commFraction"]), 4)
        if (hint := scaling.scaling_hint(result, world_size=replicas * spec.workers.procs_per_worker)) is not None:
            _set_hint(b, hint)
        basis = job_progress.basis_for(spec)
        st["progress"] = job_progress.finished(st.get("progress"), completed=basis.total, basis=basis, now=obs.now,
                                               result=result)  # fmt: skip
        b.condition("Succeeded", True, "Completed", msg)
        b.condition("Running", False, "Completed", msg)
        b.phase(SUCCEEDED, msg)
        st["completionTime"] = format_time(obs.now)
        return finish(delete_servers=spec.run_policy.clean_pod_policy != "None")

    starting = any(p.phase == "Pending" for p in current)
    if starting and (why := checkpoint_status.claim_wait(b, obs)) is not None:
        # Every pod mounts the claim: neither Unschedulable (fewer pods would wait the same) nor
        # a reason to shrink until it is bound.
        b.phase(PENDING, why)
        return finish()

    # Fault-tolerant replicas train on while minReplicas of them run: a replacement that is still
    # starting (or cannot be scheduled) leaves the job Running at a smaller quorum.
    ft_running = spec.fault_tolerant and phase == RUNNING and replica_groups.replace_alone(spec, current, obs, failure)
    waiting = [p for p in current if p.unschedulable_message]
    if waiting and not ft_running:
        worst = max(waiting, key=lambda p: p.age_s)
        el = spec.elastic
        if el is not None and worst.age_s >= el.schedule_timeout_seconds and smaller_gang_helps(waiting) and (
            new := shrunk_size(spec, replicas, placed=sum(1 for p in current if p.scheduled))
        ) is not None:
            return restart(b, st, plan, current, pods, attempt + 1, new, "ElasticShrink",
                            f"{len(waiting)} of {replicas} pods unschedulable for "
                            f"{el.schedule_timeout_seconds}s ({worst.unschedulable_message}); "
                            f"shrinking to {new} replicas, resuming from the checkpoint", count=False)
        msg = f"{len(waiting)} of {replicas} pods cannot be scheduled: {worst.unschedulable_message}"
        b.condition("Running", False, "Unschedulable", msg)
        b.phase(PENDING, msg)
        return finish()

    if ft_running or all(p.phase in ("Running", "Succeeded") for p in current):
        if phase != RUNNING:
            st.setdefault("startTime", format_time(obs.now))
            b.condition("Running", True, "GangRunning", f"all {replicas} worker pods are running (attempt {attempt})")
            b.phase(RUNNING, "training")
        if obs.progress:
            if names.STEP in obs.progress:
                st["step"] = int(obs.progress[names.STEP])
            if names.LAST_CHECKPOINT_STEP in obs.progress:
                st["lastCheckpointStep"] = int(obs.progress[names.LAST_CHECKPOINT_STEP])
            if (frac := names.comm_fraction(obs.progress)) is not None:
                st["commFraction"] = frac
            if names.STEP in obs.progress:
                st["progress"] = job_progress.build(st.get("progress"), completed=int(obs.progress[names.STEP]),
                                                    basis=job_progress.basis_for(spec), now=obs.progress_time or obs.now,
                                                    mfu=obs.progress.get(names.MFU),
                                                    finish_s=obs.progress.get(names.FINISH_SECONDS))  # fmt: skip
            _running_hint(b, obs.progress, world_size=replicas * spec.workers.procs_per_worker)
        return finish()

    held = next((p for p in current if p.phase == "Pending" and p.reason and p.message), None)
    if held is not None:  # e.g. ErrImagePull: say why instead of a bare "starting"
        msg = f"pod {held.name}: {held.reason}: {held.message}"[:500]
        b.condition("Running", False, held.reason, msg)
        b.phase(PENDING, msg)
        return finish()
    b.phase(PENDING, f"{st['workers']['pending']} of {replicas} pods starting")
    return finish()




def _running_hint(b: StatusBuilder, reading: dict[str, Any], *, world_size: int) -> None:
    """status.hint from rank 0's latest reading (disttrain_api/scaling/hint.py decides)."""
    st = b.status
    prev = st.get("hint") if isinstance(st.get("hint"), str) else None
    hint = scaling.running_hint(prev, exposed=reading.get(names.COMM_EXPOSED_FRACTION),
                                proposal=reading.get(FORECAST), known=FORECAST in reading,
                                world_size=world_size)  # fmt: skip
    if hint == prev:
        return
    if hint is None:
        st.pop("hint", None)
        return
    _set_hint(b, hint)


def _set_hint(b: StatusBuilder, hint: str) -> None:
    """status.hint = `hint`, with an Event only when it proposes another change than the last Event
    did (status.hintAnnounced): a hint that comes and goes with a job's swinging figures, or the
    finished job's hint naming the change its running hint named, is no news."""
    st = b.status
    st["hint"] = hint
    change = scaling.change_of(hint)
    if change != st.get("hintAnnounced"):
        b.event("Normal", HINT_REASON, hint)
        st["hintAnnounced"] = change


def failure(p: PodView, node_lost_after_s: float) -> str:
    """Why this pod of the live gang is lost, or '' when it is fine."""
    if p.deleting:
        return f"pod {p.name} was deleted or evicted"
    if p.phase in ("Failed", "Unknown"):
        detail = (p.message.splitlines() or [""])[-1][:300] if p.message else p.reason
        if (sig := killed_by(p)) is not None:
            # The message is then the log's tail (FallbackToLogsOnError): what it printed before, not why it ended.
            return f"pod {p.name} was killed by {sig} (exit code {p.exit_code}); its last line: {detail or 'none'}"
        code = f" (exit code {p.exit_code})" if p.exit_code is not None else ""
        return f"pod {p.name} failed{code}: {detail or 'no message'}"
    if p.not_ready_for_s >= node_lost_after_s:
        return f"pod {p.name} lost its node (not ready for {int(p.not_ready_for_s)}s)"
    return ""


def killed_by(p: PodView) -> str | None:
    """The signal a container's exit code 128 + N says killed it (SIGKILL: the OOM killer, a kill -9), or None."""
    if p.exit_code is None or not 128 < p.exit_code < 128 + 65:
        return None
    try:
        return signal.Signals(p.exit_code - 128).name
    except ValueError:
        return f"signal {p.exit_code - 128}"


def first_cause(reasons: list[str]) -> list[str]:
    """`reasons` with a pod killed by a signal first: its peers fail a moment later on the lost
    connection (gloo's "Connection reset by peer"), and pod order would blame one of them."""
    return sorted(reasons, key=lambda r: " was killed by " not in r)


def disruption(p: PodView, obs: Observed) -> str:
    """Why this pod of the live gang ended by a disruption (an eviction, a drain, a preemption,
    a deletion by someone other than this operator, a trainer stopped on request), or ''.
    A pod still running is not disrupted yet, whatever its DisruptionTarget condition says."""
    if p.disruption and failure(p, obs.node_lost_after_s):
        return p.disruption
    if p.deleting and p.uid not in obs.deleted_by_operator:
        return f"pod {p.name} was deleted by someone other than the operator (a drain, an eviction, a user)"
    return ""


# Scheduler reasons that every pod of the gang shares whatever its size (the claims are the
# job's, mounted by every worker): shrinking would restart the gang and wait the same.
_GANG_WIDE_REASONS = ("PersistentVolumeClaim",)


def smaller_gang_helps(waiting: list[PodView]) -> bool:
    """Whether the pods wait for room (CPU, memory, GPUs, affinity) that fewer pods would need."""
    return not any(r in p.unschedulable_message for p in waiting for r in _GANG_WIDE_REASONS)


def shrunk_size(spec: JobSpec, replicas: int, *, placed: int) -> int | None:
    """The gang size to shrink to when only `placed` of `replicas` pods were scheduled:
    the largest valid size (validation.valid_sizes: every rule holds there) the placed
    pods fit, else the smallest valid size below the current one; None when there is none."""
    smaller = [n for n in valid_sizes(spec) if n < replicas]
    target = placed if placed < replicas else replicas - 1
    fits = [n for n in smaller if n <= target]
    return max(fits) if fits else (smaller[0] if smaller else None)


def _replace_alone(b: StatusBuilder, st: dict[str, Any], finish: Any, current: list[PodView], missing: list[int],
                   restarts: int, obs: Observed, *, replica: bool = False) -> Plan:  # fmt: skip
    """Modes whose workers never wait for each other (paramserver, federated): only the failed pods are
    replaced, in the same attempt, while the others keep training. A failed pod is deleted (one
    restart counted, or one disruption); once gone it is missing and created again with the others
    left as they are. A pod someone else deletes (a drain) counts as a disruption when first seen
    Terminating. status.countedPods remembers the pods counted, so none is counted twice while it
    is going (pods are replaced within one attempt: the attempt cannot tell). `replica`: a
    fault-tolerant replica (Event ReplicaLost, counted in status.replicaGroups.lost)."""
    counted = dict(st.get("countedPods") or {})
    failed = [p for p in current if not p.deleting and failure(p, obs.node_lost_after_s)]
    going = [p for p in current if p.deleting and p.uid not in counted and disruption(p, obs)]
    others = ("; the other replicas train on at a smaller quorum and the replacement recovers from a live peer"
              if replica else "")  # fmt: skip
    for p in [p for p in failed if not p.uid or p.uid not in counted]:
        if why := disruption(p, obs):
            st["disruptions"] = int(st.get("disruptions") or 0) + 1
            b.event("Normal", replica_groups.LOST if replica else DISRUPTED,
                    f"{why}; replacing only this pod (not counted against runPolicy.backoffLimit){others}")
        else:
            st["restarts"] = restarts = restarts + 1
            b.event("Warning", replica_groups.LOST if replica else "WorkerReplaced",
                    f"{failure(p, obs.node_lost_after_s)}; replacing only this pod{others}")
    for p in going:
        st["disruptions"] = int(st.get("disruptions") or 0) + 1
        b.event("Normal", replica_groups.LOST if replica else DISRUPTED,
                f"{disruption(p, obs)}; replacing only this pod once it is gone (not counted against "
                f"runPolicy.backoffLimit){others}")
    if replica:
        replica_groups.note_lost(st, len([p for p in failed if not p.uid or p.uid not in counted]) + len(going))
    counted.update((p.uid, p.name) for p in failed + going if p.uid)
    live = {p.uid for p in current}
    if keep := {uid: name for uid, name in counted.items() if uid in live}:
        st["countedPods"] = keep
    else:
        st.pop("countedPods", None)
    create = bool(missing) and not failed
    if create:  # as in the gang's creation: the glue reports a blocked creation instead
        b.condition("NameConflict", False, "NamesFree", "every name this job needs is free")
        b.condition("ChildRejected", False, "Created", "the API server accepted every child")
    return finish(delete_pods=[p.name for p in failed], force_delete_pods=stuck(failed, obs), create=create)


