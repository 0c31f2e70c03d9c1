"""The reconciler's brain: from the job (spec + last status) and the pods that exist,
decide the next status and what to create or delete. Pure: no I/O, no clock, no kopf.

State lives in the cluster, never in operator memory: the gang attempt is the max of
`status.attempt` and the pods' restart-attempt labels, so an operator restarted at any
point picks up where the last one stopped. Ordering in the glue keeps it crash-safe:
on a restart the status (restarts+1, attempt+1) is written before pods are deleted;
on creation pods are created (409 = already there) before the status says so.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from disttrain_api import exitcodes
from disttrain_api import metric_names as names
from disttrain_api.model import KIND, JobSpec
from disttrain_api.validation import valid_sizes

from .observe import PodView, format_time, parse_summary, parse_time

# Phases (DESIGN.md): Pending | Running | Restarting | Succeeded | Failed | Suspended
PENDING, RUNNING, RESTARTING = "Pending", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
TERMINAL = (SUCCEEDED, FAILED)
IMMUTABLE_FIELDS = ("mode", "model", "parallelism")
# Exit code 2 is the trainer's "configuration error / mode not implemented": retrying cannot help.
PERMANENT_EXIT_CODES = exitcodes.PERMANENT
# Modes without gang restart: a failed worker (paramserver) or client (federated) pod is replaced
# alone while the others go on; its Deployment restarts a server.
SOLO_REPLACE_MODES = ("paramserver", "federated")
# The reason (condition, Event) of a gang restart or pod replacement caused by a disruption.
DISRUPTED = "Disrupted"


@dataclass(frozen=True, kw_only=True)
class Observed:
    generation: int
    name: str = ""  # the job's name
    uid: str = ""  # the job's UID: only pods whose controller reference carries it are the job's
    spec: JobSpec | None  # None when the spec is invalid
    spec_error: str = ""
    # Spec the existing gang was built from (its ConfigMap); with an invalid spec, the job
    # goes on with it.
    accepted: JobSpec | None = None
    status: dict[str, Any] = field(default_factory=dict)
    pods: list[PodView] = field(default_factory=list)  # gang pods of every attempt
    progress: dict[str, float] | None = None  # rank 0's disttrain_step / disttrain_last_checkpoint_step
    now: datetime
    force_delete_after_s: float = 30.0
    node_lost_after_s: float = 300.0  # settings.NODE_LOST_AFTER_S: Kubernetes' pod-eviction default
    # UIDs of pods this operator deleted lately (reconcile.Expectations): a pod deleted by
    # anyone else (a drain, an eviction, a user) is a disruption, not a failure.
    deleted_by_operator: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class Plan:
    status: dict[str, Any]
    spec: JobSpec | None = None  # effective spec (immutable fields from the accepted spec)
    create: bool = False  # create the gang at status.attempt / status.replicas
    delete_pods: list[str] = field(default_factory=list)
    force_delete_pods: list[str] = field(default_factory=list)
    delete_servers: bool = False  # federated/paramserver Deployment
    delete_job: bool = False  # ttlSecondsAfterFinished expired
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)


# Conditions that record a state the job reached by itself, not something the operator did
# or a problem: the condition (with its lastTransitionTime) is the record, and no Event is
# posted. Events say what the operator did (created, deleted, restarted, replaced, resized,
# suspended, resumed a gang) and every failure, so a healthy job costs one Event, not one
# per phase.
STATE_CONDITIONS = ("Running", "Succeeded")


class _Builder:
    """Accumulates status changes and the Events of the operator's actions and of failures."""

    def __init__(self, status: dict[str, Any], now: datetime) -> None:
        self.status = copy.deepcopy(status)
        self.status.setdefault("conditions", [])
        self.now = now
        self.events: list[tuple[str, str, str]] = []

    def condition(self, type_: str, value: bool, reason: str, message: str = "") -> None:
        want = "True" if value else "False"
        for cond in self.status["conditions"]:
            if cond.get("type") == type_:
                if cond.get("status") != want:
                    cond["lastTransitionTime"] = format_time(self.now)
                    if value:
                        self._event(type_, reason, message)
                elif value and cond.get("reason") != reason:
                    self._event(type_, reason, message)
                cond.update(status=want, reason=reason, message=message)
                return
        if not value and type_ not in ("Running", "Suspended"):
            return  # absent == False; only record the ones users look for
        self.status["conditions"].append(
            {"type": type_, "status": want, "reason": reason, "message": message,
             "lastTransitionTime": format_time(self.now)}
        )
        if value:
            self._event(type_, reason, message)

    def is_true(self, type_: str, reason: str | None = None) -> bool:
        for cond in self.status["conditions"]:
            if cond.get("type") == type_ and cond.get("status") == "True":
                return reason is None or cond.get("reason") == reason
        return False

    def _event(self, type_: str, reason: str, message: str) -> None:
        if type_ in STATE_CONDITIONS:
            return
        warn = (type_ in ("Failed", "InvalidSpec", "Restarting", "NameConflict", "ChildRejected")
                or reason in ("Unschedulable",)) and reason != DISRUPTED
        self.event("Warning" if warn else "Normal", reason, message or type_)

    def event(self, kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    def phase(self, value: str, message: str = "") -> None:
        self.status["phase"] = value
        self.status["message"] = message


def _immutable_diff(old: JobSpec, new: JobSpec) -> list[str]:
    return [f"spec.{name}" for name in IMMUTABLE_FIELDS if getattr(old, name) != getattr(new, name)]


def _counts(pods: list[PodView]) -> dict[str, int]:
    phases = [p.phase for p in pods if not p.deleting]
    return {
        "active": sum(ph in ("Pending", "Running") for ph in phases),
        "pending": phases.count("Pending"),
        "succeeded": phases.count("Succeeded"),
        "failed": sum(ph in ("Failed", "Unknown") for ph in phases),
    }


def _failure(p: PodView, node_lost_after_s: float) -> str:
    """Why this pod of the live gang is lost, or '' when it is fine."""
    if p.deleting:
        return f"pod {p.name} was deleted or evicted"
    if p.phase in ("Failed", "Unknown"):
        detail = (p.message.splitlines() or [""])[-1][:300] if p.message else p.reason
        code = f" (exit code {p.exit_code})" if p.exit_code is not None else ""
        return f"pod {p.name} failed{code}: {detail or 'no message'}"
    if p.not_ready_for_s >= node_lost_after_s:
        return f"pod {p.name} lost its node (not ready for {int(p.not_ready_for_s)}s)"
    return ""


def _disruption(p: PodView, obs: Observed) -> str:
    """Why this pod of the live gang ended by a disruption (an eviction, a drain, a preemption,
    a deletion by someone other than this operator, a trainer stopped on request), or ''.
    A pod still running is not disrupted yet, whatever its DisruptionTarget condition says."""
    if p.disruption and _failure(p, obs.node_lost_after_s):
        return p.disruption
    if p.deleting and p.uid not in obs.deleted_by_operator:
        return f"pod {p.name} was deleted by someone other than the operator (a drain, an eviction, a user)"
    return ""


def earlier_job(p: PodView, obs: Observed) -> bool:
    """A pod of an earlier job with this name: the garbage collector deletes it with its owner."""
    return p.owner_kind == KIND and p.owner_uid != obs.uid and p.owner_name in ("", obs.name)


def decide(obs: Observed) -> Plan:
    """The next status and actions. Pods carrying the job's labels but controlled by
    another owner are never adopted, counted or deleted: those of an earlier job with
    this name go with it (garbage collection), any other (an orphan, another owner's) is
    a NameConflict. No gang is created while either exists: they hold the pod names and
    would answer for the job's DNS names. Only a pod of an earlier job that its node
    cannot confirm deleted (Terminating for too long) is force-deleted, as ours are."""
    ours = [p for p in obs.pods if p.owner_uid == obs.uid]
    foreign = [p for p in obs.pods if p.owner_uid != obs.uid]
    plan = _decide(dataclasses.replace(obs, pods=ours), foreign)
    stuck = _stuck([p for p in foreign if earlier_job(p, obs)], obs)
    if not stuck:
        return plan
    return dataclasses.replace(plan, force_delete_pods=sorted({*plan.force_delete_pods, *stuck}))


def _decide(obs: Observed, foreign: list[PodView]) -> Plan:
    b = _Builder(obs.status, obs.now)
    st = b.status
    st["observedGeneration"] = obs.generation
    pods = obs.pods

    if obs.spec is None and obs.accepted is None:  # never had a valid spec: nothing to go on with
        b.condition("InvalidSpec", True, "InvalidSpec", obs.spec_error)
        b.phase(FAILED, f"invalid spec: {obs.spec_error}")
        return Plan(status=st, delete_pods=[p.name for p in pods if not p.deleting], events=b.events)
    if obs.spec is None:
        # An edit made the spec invalid: the gang goes on with the spec it was built from (a
        # fix clears the condition without touching the pods), at the size the user last
        # asked for.
        assert obs.accepted is not None
        b.condition("InvalidSpec", True, "InvalidSpec", f"{obs.spec_error} (the job goes on with its last valid "
                    "spec until this is fixed)")
        last = int(st.get("lastSpecReplicas") or 0) or obs.accepted.workers.replicas
        spec = dataclasses.replace(obs.accepted, workers=dataclasses.replace(obs.accepted.workers, replicas=last))
        accepted = None
    else:
        if b.is_true("InvalidSpec", "InvalidSpec"):
            b.condition("InvalidSpec", False, "SpecValid", "the spec was fixed")
            if st.get("phase") in (FAILED, None, ""):
                b.phase(PENDING)
        spec, accepted = obs.spec, obs.accepted
    if accepted is not None:
        changed = _immutable_diff(accepted, spec)
        if changed:
            msg = (f"{', '.join(changed)} cannot change while the job exists (immutable); "
                   "revert the change or create a new job")
            b.condition("InvalidSpec", True, "ImmutableFieldChanged", msg)
            spec = dataclasses.replace(spec, **{n: getattr(accepted, n) for n in IMMUTABLE_FIELDS})
        elif b.is_true("InvalidSpec", "ImmutableFieldChanged"):
            b.condition("InvalidSpec", False, "SpecValid", "immutable fields match the running job again")

    attempt = max([int(st.get("attempt") or 0), *(p.attempt for p in pods)])
    replicas = int(st.get("replicas") or spec.workers.replicas)
    restarts = int(st.get("restarts") or 0)
    phase = st.get("phase") or ""
    current = [p for p in pods if p.attempt == attempt]
    st.setdefault("restarts", restarts)
    st.setdefault("disruptions", 0)
    st["attempt"], st["replicas"] = attempt, replicas
    st["workers"] = _counts(current)
    plan: dict[str, Any] = {"spec": spec}

    def finish(**kw: Any) -> Plan:
        return Plan(status=st, events=b.events, **{**plan, **kw})

    live = [p for p in pods if not p.deleting and p.phase in ("Pending", "Running")]

    # ---- finished jobs: clean up per cleanPodPolicy, then the TTL.
    if phase in TERMINAL:
        policy = spec.run_policy.clean_pod_policy
        doomed = [] if policy == "None" else [p.name for p in (pods if policy == "All" else live) if not p.deleting]
        ttl = spec.run_policy.ttl_seconds_after_finished
        done_at = parse_time(st.get("completionTime"))
        expired = ttl is not None and done_at is not None and obs.now >= done_at + timedelta(seconds=ttl)
        return finish(delete_pods=doomed, delete_servers=policy != "None", delete_job=expired)

    # ---- activeDeadlineSeconds counts from the first start.
    started = parse_time(st.get("startTime"))
    deadline = spec.run_policy.active_deadline_seconds
    if deadline is not None and started is not None and obs.now >= started + timedelta(seconds=deadline):
        msg = f"the job ran longer than runPolicy.activeDeadlineSeconds={deadline}"
        b.condition("Failed", True, "DeadlineExceeded", msg)
        b.condition("Running", False, "DeadlineExceeded", msg)
        b.phase(FAILED, msg)
        st["completionTime"] = format_time(obs.now)
        return finish(delete_pods=[p.name for p in live], delete_servers=True)

    # ---- suspend: delete the pods, keep checkpoints; resume creates the next attempt.
    if spec.run_policy.suspend:
        if phase != SUSPENDED:
            b.condition("Suspended", True, "Suspended", "runPolicy.suspend is true: pods deleted, checkpoints kept")
            b.condition("Running", False, "Suspended", "suspended")
            b.condition("Created", False, "Suspended", "suspended: the gang is deleted")
            b.phase(SUSPENDED, "suspended")
        # A pod Terminating for too long (its kubelet cannot confirm) is force-deleted, as on
        # a restart: a suspended job holds no pods.
        return finish(delete_pods=[p.name for p in pods if not p.deleting], force_delete_pods=_stuck(pods, obs),
                      delete_servers=True)  # fmt: skip

    # ---- replicas may change only inside the elastic range (a resize = a new attempt).
    desired = spec.workers.replicas
    if int(st.get("lastSpecReplicas") or 0) > 0 and int(st["lastSpecReplicas"]) != desired:
        el = spec.elastic
        if el is not None and el.min_replicas <= desired <= el.max_replicas:
            if desired != replicas and phase in (PENDING, RUNNING):
                st["lastSpecReplicas"] = desired
                return _restart(b, st, plan, current, pods, attempt + 1, desired, "Resized",
                                f"spec.workers.replicas changed to {desired}: recreating the gang", count=False)
            replicas = st["replicas"] = desired
        else:
            rng = f"[{el.min_replicas}, {el.max_replicas}]" if el else "(no spec.elastic)"
            b.condition("InvalidSpec", True, "ImmutableFieldChanged",
                        f"spec.workers.replicas may only change within spec.elastic {rng}; keeping {replicas}")
            desired = int(st["lastSpecReplicas"])
    st["lastSpecReplicas"] = desired

    if phase == SUSPENDED:  # resumed
        if any(p for p in pods if p.attempt == attempt):
            return finish(force_delete_pods=_stuck(pods, obs))
        msg = "runPolicy.suspend is false: resuming from the checkpoint"
        b.condition("Suspended", False, "Resumed", msg)
        b.event("Normal", "Resumed", msg)  # a condition turning False posts no Event by itself
        attempt += 1
        st["attempt"] = attempt
        current = []
        phase = RESTARTING
        b.phase(RESTARTING, "resuming")

    # ---- leftovers of older attempts must be gone before the next gang starts
    # (the new pods reuse their names and DNS records).
    stale = [p for p in pods if p.attempt != attempt]
    if stale:
        return finish(
            delete_pods=[p.name for p in stale if not p.deleting],
            force_delete_pods=_stuck(stale, obs),
        )

    if phase in ("", RESTARTING) or (phase == PENDING and not b.is_true("Created")):
        others = [p for p in foreign if not earlier_job(p, obs)]
        if others:
            msg = "; ".join(name_conflict(f"Pod {p.name}", p.owner_kind, p.owner_name) for p in others[:3])
            b.condition("NameConflict", True, "NameConflict", msg)
            b.phase(PENDING, f"waiting for names to be free: {msg}")
            return finish()
        if foreign:
            b.phase(PENDING, f"waiting for the garbage collector to delete {len(foreign)} pod(s) of an earlier "
                             f"job with this name (e.g. {foreign[0].name})")
            return finish()
        n = len(current)
        msg = f"created {replicas} {spec.mode}-parallel worker pods (attempt {attempt})"
        # Assumes the creation succeeds; the glue writes blocked.creation_blocked's status instead when not.
        b.condition("NameConflict", False, "NamesFree", "every name this job needs is free")
        b.condition("ChildRejected", False, "Created", "the API server accepted every child")
        b.condition("Created", True, "GangCreated", msg)
        if phase == RESTARTING:
            b.condition("Restarting", False, "GangRecreated", msg)
        b.phase(PENDING, f"waiting for {replicas - n if n < replicas else replicas} pods to start")
        st["workers"] = {**st["workers"], "active": max(n, replicas), "pending": max(replicas - n, 0)}
        return finish(create=True)

    # ---- the gang exists: failed / vanished / unschedulable / running / done.
    gang = {p.index: p for p in current}
    missing = [i for i in range(replicas) if i not in gang]
    reasons = [r for p in current if (r := _failure(p, obs.node_lost_after_s))]
    if missing:
        reasons.append(f"worker pod(s) {missing} vanished")
    if reasons:
        permanent = [p for p in current if p.exit_code in PERMANENT_EXIT_CODES]
        limit = spec.run_policy.backoff_limit
        # A disrupted pod is counted in status.disruptions, never against backoffLimit. In a gang
        # its peers fail with it (they stop at the step it stopped at, or lose their connection
        # to it): the whole restart is the disruption's.
        disrupted = [d for p in current if (d := _disruption(p, obs))]
        if spec.mode in SOLO_REPLACE_MODES and not permanent and (
            restarts < limit or not any(not p.deleting and _failure(p, obs.node_lost_after_s)
                                        and not _disruption(p, obs) for p in current)
        ):  # below the limit, or only disruptions and finishing replacements already counted
            return _replace_alone(b, st, finish, current, missing, restarts, obs)
        if disrupted and not permanent and spec.mode not in SOLO_REPLACE_MODES:
            st["disruptions"] = int(st.get("disruptions") or 0) + 1
            return _restart(b, st, plan, current, pods, attempt + 1, replicas, DISRUPTED,
                            f"{disrupted[0]}; restarting the gang from its checkpoint (a disruption: not counted "
                            f"against runPolicy.backoffLimit)", count=False,
                            force=_stuck(current, obs) + [p.name for p in current if p.not_ready_for_s > 0])
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
        return _restart(b, st, plan, current, pods, attempt + 1, replicas, kind,
                        f"{reasons[0]}; restarting the gang from the last checkpoint", count=True,
                        force=_stuck(current, obs) + [p.name for p in current if p.not_ready_for_s > 0])

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
        b.condition("Succeeded", True, "Completed", msg)
        b.condition("Running", False, "Completed", msg)
        b.phase(SUCCEEDED, msg)
        st["completionTime"] = format_time(obs.now)
        return finish(delete_servers=spec.run_policy.clean_pod_policy != "None")

    waiting = [p for p in current if p.unschedulable_message]
    if waiting:
        worst = max(waiting, key=lambda p: p.age_s)
        el = spec.elastic
        if el is not None and worst.age_s >= el.schedule_timeout_seconds and (
            new := _shrunk_size(spec, replicas, placed=sum(1 for p in current if p.scheduled))
        ) is not None:
            return _restart(b, st, plan, current, pods, attempt + 1, new, "ElasticShrink",
                            f"{len(waiting)} of {replicas} pods unschedulable for "
                            f"{el.schedule_timeout_seconds}s ({worst.unschedulable_message}); "
                            f"shrinking to {new} replicas, resuming from the checkpoint", count=False)
        msg = f"{len(waiting)} of {replicas} pods cannot be scheduled: {worst.unschedulable_message}"
        b.condition("Running", False, "Unschedulable", msg)
        b.phase(PENDING, msg)
        return finish()

    if all(p.phase in ("Running", "Succeeded") for p in current):
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
        return finish()

    stuck = next((p for p in current if p.phase == "Pending" and p.reason and p.message), None)
    if stuck is not None:  # e.g. ErrImagePull: say why instead of a bare "starting"
        msg = f"pod {stuck.name}: {stuck.reason}: {stuck.message}"[:500]
        b.condition("Running", False, stuck.reason, msg)
        b.phase(PENDING, msg)
        return finish()
    b.phase(PENDING, f"{st['workers']['pending']} of {replicas} pods starting")
    return finish()


def name_conflict(what: str, owner_kind: str, owner_name: str) -> str:
    """A user's explanation of an object that holds a name the job needs."""
    by = f"controlled by {owner_kind} {owner_name}" if owner_kind else "with no controller owner"
    return (f"{what} exists, {by}, and is not this job's: the operator leaves it alone; delete or rename it, "
            "or give the job another name")


def _shrunk_size(spec: JobSpec, replicas: int, *, placed: int) -> int | None:
    """The gang size to shrink to when only `placed` of `replicas` pods were scheduled:
    the largest valid size (validation.valid_sizes: every rule holds there) the placed
    pods fit, else the smallest valid size below the current one; None when there is none."""
    smaller = [n for n in valid_sizes(spec) if n < replicas]
    target = placed if placed < replicas else replicas - 1
    fits = [n for n in smaller if n <= target]
    return max(fits) if fits else (smaller[0] if smaller else None)


def _stuck(pods: list[PodView], obs: Observed) -> list[str]:
    """Pods Terminating for too long (their node is gone and cannot confirm): force-delete."""
    return [p.name for p in pods if p.deleting and p.deleting_for_s >= obs.force_delete_after_s]


def _replace_alone(b: _Builder, st: dict[str, Any], finish: Any, current: list[PodView], missing: list[int],
                   restarts: int, obs: Observed) -> Plan:  # fmt: skip
    """Modes whose workers never wait for each other (paramserver, federated): only the failed pods are
    replaced, in the same attempt, while the others keep training. A failed pod is deleted (one
    restart counted, or one disruption); once gone it is missing and created again with the others
    left as they are. A pod someone else deletes (a drain) counts as a disruption when first seen
    Terminating. status.countedPods remembers the pods counted, so none is counted twice while it
    is going (pods are replaced within one attempt: the attempt cannot tell)."""
    counted = dict(st.get("countedPods") or {})
    failed = [p for p in current if not p.deleting and _failure(p, obs.node_lost_after_s)]
    going = [p for p in current if p.deleting and p.uid not in counted and _disruption(p, obs)]
    for p in [p for p in failed if not p.uid or p.uid not in counted]:
        if why := _disruption(p, obs):
            st["disruptions"] = int(st.get("disruptions") or 0) + 1
            b.event("Normal", DISRUPTED, f"{why}; replacing only this pod (not counted against runPolicy.backoffLimit)")
        else:
            st["restarts"] = restarts = restarts + 1
            b.event("Warning", "WorkerReplaced", f"{_failure(p, obs.node_lost_after_s)}; replacing only this pod")
    for p in going:
        st["disruptions"] = int(st.get("disruptions") or 0) + 1
        b.event("Normal", DISRUPTED, f"{_disruption(p, obs)}; replacing only this pod once it is gone "
                                     "(not counted against runPolicy.backoffLimit)")  # fmt: skip
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
    return finish(delete_pods=[p.name for p in failed], force_delete_pods=_stuck(failed, obs), create=create)


def _restart(
    b: _Builder,
    st: dict[str, Any],
    plan: dict[str, Any],
    current: list[PodView],
    pods: list[PodView],
    attempt: int,
    replicas: int,
    reason: str,
    message: str,
    *,
    count: bool,
    force: list[str] | None = None,
) -> Plan:
    if count:
        st["restarts"] = int(st.get("restarts") or 0) + 1
    st["attempt"], st["replicas"] = attempt, replicas
    b.condition("Restarting", True, reason, message)
    b.condition("Running", False, reason, message)
    b.condition("Created", False, "Restarting", message)
    b.phase(RESTARTING, message)
    return Plan(
        status=st,
        events=b.events,
        spec=plan["spec"],
        delete_pods=[p.name for p in pods if not p.deleting],
        force_delete_pods=sorted(set(force or [])),
        delete_servers=False,
    )


def needs_recheck(obs: Observed, plan: Plan) -> bool:
    """Whether the clock alone can change the next decision, so the job must be reconciled
    again after a while although no watch event may come: a deadline or TTL running, a pod
    Terminating (force-deleted after a while), a pod whose node stopped reporting, a pod
    that an elastic job may give up waiting for. Everything else changes with an event of
    the job or of one of its pods."""
    spec = plan.spec or obs.spec
    if spec is None:
        return False
    phase = plan.status.get("phase")
    if phase in TERMINAL:
        return spec.run_policy.ttl_seconds_after_finished is not None and not plan.delete_job
    if spec.run_policy.active_deadline_seconds is not None and plan.status.get("startTime"):
        return True
    # (The pod event that says Ready turned False comes; the node-lost timeout after it does not.)
    if any(p.deleting or p.not_ready_for_s > 0 for p in obs.pods):
        return True
    return spec.elastic is not None and any(p.unschedulable_message for p in obs.pods)
