"""Turn raw Kubernetes pod JSON into the few facts the reconciler decides on.

Pure functions over dicts (as the API returns them), so they are unit-tested with
captured pod JSON and no cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from disttrain_api import constants as c
from disttrain_api import exitcodes


@dataclass(frozen=True, kw_only=True)
class PodView:
    name: str
    uid: str = ""
    role: str
    index: int
    attempt: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool = False
    deleting_for_s: float = 0.0
    # Every container, init containers included, has terminated, as the pod's kubelet reported:
    # no process of the pod runs any more (what is left of a deleted one is the kubelet's
    # clean-up of its sandbox, volumes and cgroup).
    stopped: bool = False
    age_s: float = 0.0
    scheduled: bool = False
    unschedulable_message: str = ""  # scheduler's reason while it cannot place the pod
    not_ready_for_s: float = 0.0  # Running with Ready=False this long: the node stopped reporting
    ip: str = ""
    exit_code: int | None = None
    reason: str = ""
    message: str = ""  # the container's termination message (rank 0's summary JSON on success)
    owner_uid: str = ""  # UID of the pod's controller (ownerReferences[controller=true]); "" when none
    owner_kind: str = ""
    owner_name: str = ""
    # Why the pod ended by a disruption rather than a failure of its own, from what the pod
    # itself says (disruption_of); "" otherwise. A deletion by someone other than the
    # operator is a disruption too: running_gang.py tells it from the operator's own deletions.
    disruption: str = ""


# status.reason of a pod that the kubelet ended, before 1.26 added the DisruptionTarget
# condition (the local cluster runs 1.20): node-pressure eviction, preemption by a critical
# pod, graceful node shutdown (1.21+: "Terminated"; later "Shutdown"/"NodeShutdown").
DISRUPTION_REASONS = {
    "Evicted": "evicted by its kubelet",
    "Preempting": "preempted by its kubelet for a critical pod",
    "Terminated": "terminated by its kubelet for a node shutdown",
    "Shutdown": "terminated by its kubelet for a node shutdown",
    "NodeShutdown": "terminated by its kubelet for a node shutdown",
}
DISRUPTION_CONDITION = "DisruptionTarget"  # Kubernetes >= 1.26: eviction, preemption, taint manager, GC


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference with controller=true (at most one per object), or None."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


_POD_META = ("name", "namespace", "uid", "labels", "ownerReferences", "creationTimestamp", "deletionTimestamp")


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The part of a pod that `pod_view` reads (metadata subset + status): what the operator
    keeps in memory per pod, instead of the whole object with its spec and managed fields."""
    meta = pod.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in _POD_META if k in meta}, "status": pod.get("status") or {}}


def disruption_of(name: str, phase: str, pod_reason: str, message: str, conditions: dict[str, Any],
                  exit_code: int | None, *, deleting: bool) -> str:  # fmt: skip
    """Why a pod that ended (or is being ended) was disrupted, or "" when nothing says so.

    Exit code STOPPED says only that the trainer got SIGTERM and saved its step; it is a
    disruption when a stop was asked for: the pod is being deleted (by the operator, a drain,
    an eviction, a user: every DELETE sets deletionTimestamp before the kubelet signals the
    container, so the pod itself records the request, whoever made it and across operator
    restarts), or a DisruptionTarget condition or a kubelet's reason says so (above). A
    trainer that exits 3 with none of these (its own code did, or a signal from inside the
    container) failed: it counts against runPolicy.backoffLimit, or it would restart forever."""
    target = conditions.get(DISRUPTION_CONDITION) or {}
    if target.get("status") == "True":
        detail = target.get("message") or target.get("reason") or "DisruptionTarget"
        return f"pod {name} was disrupted ({target.get('reason') or 'DisruptionTarget'}: {detail})"[:300]
    if phase != "Failed":
        return ""
    if pod_reason in DISRUPTION_REASONS:
        detail = f": {message}" if message else ""
        return f"pod {name} was {DISRUPTION_REASONS[pod_reason]}{detail}"[:300]
    if exit_code == exitcodes.STOPPED and deleting:
        return f"pod {name} stopped on request (exit code {exit_code}) after checkpointing its step"
    return ""


def pod_view(pod: dict[str, Any], now: datetime) -> PodView:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    created = parse_time(meta.get("creationTimestamp"))
    deleted = parse_time(meta.get("deletionTimestamp"))
    conditions = {cond.get("type"): cond for cond in status.get("conditions") or []}
    sched = conditions.get("PodScheduled") or {}
    ready = conditions.get("Ready") or {}
    phase = status.get("phase") or "Pending"
    unsched = ""
    if sched.get("status") == "False" and sched.get("reason") == "Unschedulable":
        unsched = sched.get("message") or "Unschedulable"
    not_ready_for = 0.0
    container_running = any("running" in (cs.get("state") or {}) for cs in status.get("containerStatuses") or [])
    if phase == "Running" and container_running and ready.get("status") == "False":
        since = parse_time(ready.get("lastTransitionTime"))
        not_ready_for = (now - since).total_seconds() if since else 0.0
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    # (A container waiting without an ID may be in the middle of its creation: not stopped.)
    stopped = bool(status.get("containerStatuses")) and all("terminated" in (cs.get("state") or {})
                                                            for cs in statuses)
    exit_code: int | None = None
    reason = status.get("reason") or ""
    message = status.get("message") or ""
    pod_reason, pod_message = reason, message
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != "trainer":
            continue
        term = (cs.get("state") or {}).get("terminated")
        if term:
            exit_code = _int(term.get("exitCode"), -1)
            reason = term.get("reason") or reason
            message = (term.get("message") or message or "").strip()
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                                 "CreateContainerConfigError", "CreateContainerError"):
            reason, message = waiting.get("reason", ""), waiting.get("message", "")
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=labels.get(c.LABEL_ROLE, ""),
        index=_int(labels.get(c.LABEL_REPLICA_INDEX), -1),
        attempt=_int(labels.get(c.LABEL_RESTART_ATTEMPT)),
        phase=phase,
        deleting=deleted is not None,
        deleting_for_s=(now - deleted).total_seconds() if deleted else 0.0,
        stopped=stopped,
        age_s=(now - created).total_seconds() if created else 0.0,
        scheduled=sched.get("status") == "True",
        unschedulable_message=unsched,
        not_ready_for_s=not_ready_for,
        ip=status.get("podIP") or "",
        exit_code=exit_code,
        reason=reason,
        message=message,
        owner_uid=(controller_of(pod) or {}).get("uid", ""),
        owner_kind=(controller_of(pod) or {}).get("kind", ""),
        disruption=disruption_of(meta.get("name", ""), phase, pod_reason, pod_message, conditions, exit_code,
                                 deleting=deleted is not None),
        owner_name=(controller_of(pod) or {}).get("name", ""),
    )


def parse_summary(message: str) -> dict[str, Any] | None:
    """Rank 0's termination message is its summary JSON; anything else is not a result."""
    text = message.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def parse_prometheus(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """The first sample of each named series in a Prometheus text exposition."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, rest = line.partition(" ")
        base = series.split("{", 1)[0]
        if base in names and base not in found:
            try:
                found[base] = float(rest.split()[0])
            except (IndexError, ValueError):
                continue
    return found


@dataclass(frozen=True, kw_only=True)
class ClaimView:
    """The job's checkpoint claim as last read (checkpoint_status.py decides on it)."""

    name: str
    phase: str  # Pending | Bound | Lost
    age_s: float = 0.0
    storage_class: str = ""  # "" when the claim names none (the cluster's default class, if any)
    access_modes: tuple[str, ...] = ()
    size: str = ""


def claim_view(claim: dict[str, Any], now: datetime) -> ClaimView:
    meta, spec = claim.get("metadata") or {}, claim.get("spec") or {}
    created = parse_time(meta.get("creationTimestamp"))
    return ClaimView(
        name=str(meta.get("name", "")),
        phase=str((claim.get("status") or {}).get("phase") or "Pending"),
        age_s=max((now - created).total_seconds(), 0.0) if created else 0.0,
        storage_class=str(spec.get("storageClassName") or ""),
        access_modes=tuple(spec.get("accessModes") or ()),
        size=str(((spec.get("resources") or {}).get("requests") or {}).get("storage", "")),
    )
