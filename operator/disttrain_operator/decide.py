"""The reconciler's brain: from the job (spec + last status) and the pods that exist,
decide the next status and what to create or delete. Pure: no I/O, no clock, no kopf.

State lives in the cluster, never in operator memory: the gang attempt is the max of
`status.attempt` and the pods' restart-attempt labels, so an operator restarted at any
point picks up where the last one stopped. Ordering in the glue keeps it crash-safe:
on a restart the status (restarts+1, attempt+1) is written before pods are deleted;
on creation pods are created (409 = already there) before the status says so.

By phase: here, the spec (invalid, immutable fields), a finished job's clean-up and TTL, the
deadline, suspend and resume, a resize, the previous attempt's pods and the gang's creation;
once the gang exists, running_gang.py; the types and the status builder, decision.py.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from disttrain_api.model import KIND, JobSpec

from . import checkpoint_status, job_secrets
from .decision import (
    FAILED,
    IMMUTABLE_FIELDS,
    PENDING,
    RESTARTING,
    RUNNING,
    SUSPENDED,
    TERMINAL,
    Observed,
    Plan,
    StatusBuilder,
    restart,
    stuck,
)
from .observe import PodView, format_time, parse_time
from .running_gang import decide_running
from .topology import gang_role
from .topology.common import pod_name


def earlier_job(p: PodView, obs: Observed) -> bool:
    """A pod of an earlier job with this name: the garbage collector deletes it with its owner."""
    return p.owner_kind == KIND and p.owner_uid != obs.uid and p.owner_name in ("", obs.name)


def decide(obs: Observed) -> Plan:
    """The next status and actions. Pods carrying the job's labels but controlled by
    another owner are never adopted, counted or deleted: those of an earlier job with
    this name go with it (garbage collection), and no gang is created while they exist
    (they hold the pod names and would answer for the job's DNS names). Any other (an
    orphan, another owner's pod) is a NameConflict only when it holds the name of a pod
    the gang needs; one that merely copies the job's labels is ignored (anyone who can
    create pods in the namespace could otherwise keep the job from starting). Only a pod
    of an earlier job that is Terminating and stopped, or that its node cannot confirm deleted
    (Terminating for too long), is force-deleted, as ours are."""
    ours = [p for p in obs.pods if p.owner_uid == obs.uid]
    foreign = [p for p in obs.pods if p.owner_uid != obs.uid]
    plan = _decide(dataclasses.replace(obs, pods=ours), foreign)
    held = stuck([p for p in foreign if earlier_job(p, obs)], obs)
    if not held:
        return plan
    return dataclasses.replace(plan, force_delete_pods=sorted({*plan.force_delete_pods, *held}))


def _decide(obs: Observed, foreign: list[PodView]) -> Plan:
    b = StatusBuilder(obs.status, obs.now)
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

    checkpoint_status.ephemeral_condition(b, spec)

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
        return finish(delete_pods=[p.name for p in pods if not p.deleting], force_delete_pods=stuck(pods, obs),
                      delete_servers=True)  # fmt: skip

    # ---- replicas may change only inside the elastic range (a resize = a new attempt).
    desired = spec.workers.replicas
    if int(st.get("lastSpecReplicas") or 0) > 0 and int(st["lastSpecReplicas"]) != desired:
        el = spec.elastic
        if el is not None and el.min_replicas <= desired <= el.max_replicas:
            if desired != replicas and phase in (PENDING, RUNNING):
                st["lastSpecReplicas"] = desired
                return restart(b, st, plan, current, pods, attempt + 1, desired, "Resized",
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
            return finish(force_delete_pods=stuck(pods, obs))
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
            force_delete_pods=stuck(stale, obs),
        )

    if phase in ("", RESTARTING) or (phase == PENDING and not b.is_true("Created")):
        names = gang_pod_names(spec, obs.name, replicas)
        others = [p for p in foreign if not earlier_job(p, obs) and p.name in names]
        if others:
            msg = "; ".join(name_conflict(f"Pod {p.name}", p.owner_kind, p.owner_name) for p in others[:3])
            b.condition("NameConflict", True, "NameConflict", msg)
            b.phase(PENDING, f"waiting for names to be free: {msg}")
            return finish()
        earlier = [p for p in foreign if earlier_job(p, obs)]
        if earlier:
            b.phase(PENDING, f"waiting for the garbage collector to delete {len(earlier)} pod(s) of an earlier "
                             f"job with this name (e.g. {earlier[0].name})")
            return finish()
        if mint := job_secrets.due(spec, st, obs.now, obs.tls_renew_before_s):
            # Created and recorded in the status by this reconcile; the gang, mounting them, by the next.
            return finish(mint_secrets=mint)
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

    return decide_running(b, finish, plan, obs, spec=spec, pods=pods, current=current, live=live, attempt=attempt,
                          replicas=replicas, restarts=restarts, phase=phase)


def gang_pod_names(spec: JobSpec, job: str, replicas: int) -> frozenset[str]:
    """The names of the gang's pods (the server Deployments' pods get generated names)."""
    return frozenset(pod_name(job, gang_role(spec.mode), i) for i in range(replicas))


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


def name_conflict(what: str, owner_kind: str, owner_name: str) -> str:
    """A user's explanation of an object that holds a name the job needs."""
    by = f"controlled by {owner_kind} {owner_name}" if owner_kind else "with no controller owner"
    return (f"{what} exists, {by}, and is not this job's: the operator leaves it alone; delete or rename it, "
            "or give the job another name")


def needs_recheck(obs: Observed, plan: Plan) -> bool:
    """Whether the clock alone can change the next decision, so the job must be reconciled
    again after a while although no watch event may come: a deadline or TTL running, a pod
    Terminating (force-deleted after a while), a pod whose node stopped reporting, a pod
    that an elastic job may give up waiting for, a checkpoint claim still Pending. Everything else changes with an event of
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
    if checkpoint_status.claim_waits(obs):  # CheckpointClaimPending once it has waited too long
        return True
    return spec.elastic is not None and any(p.unschedulable_message for p in obs.pods)
