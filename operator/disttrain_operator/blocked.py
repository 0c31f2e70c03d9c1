"""The status of a job whose children could not be created (pure, like decide.py).

decide() plans a creation as if it will succeed; when creation.create_children reports
otherwise, the glue writes this status instead: the plan's other changes stay, the gang
is not marked Created, and the cause becomes a condition with an Event naming the
objects:
- NameConflict: a name the job needs is held by an object that is not its own; the job
  waits (the operator retries with backoff) and goes on once the name is free;
- ChildRejected: the API server refused a child (its message quoted); retried with
  backoff for runPolicy.childRejectedTimeoutSeconds, then the job fails with that reason;
- an earlier job's objects still being garbage-collected: only a message, they go soon.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timedelta
from typing import Any

from .creation import Outcome
from .decision import FAILED, PENDING, RESTARTING, Plan, StatusBuilder
from .observe import format_time, parse_time

# Conditions of the creation itself: what the blocked status keeps as it was before.
_CREATION_CONDITIONS = ("Created", "Restarting", "NameConflict", "ChildRejected")


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def _true(status: dict[str, Any], type_: str) -> bool:
    return (_condition(status, type_) or {}).get("status") == "True"


def creation_blocked(plan: Plan, old: dict[str, Any], now: datetime, outcome: Outcome,
                     ours: list[str]) -> tuple[Plan, float | None]:  # fmt: skip
    """The plan to act on instead of `plan`, and the seconds left before a rejection fails
    the job (None when nothing was rejected). `ours`: the job's live pods (deleted if it
    fails)."""
    status = copy.deepcopy(plan.status)
    kept = [c for c in status.get("conditions") or [] if c.get("type") not in _CREATION_CONDITIONS]
    status["conditions"] = kept + [copy.deepcopy(c) for c in old.get("conditions") or []
                                   if c.get("type") in _CREATION_CONDITIONS]
    gang_planned = _true(plan.status, "Created") and not _true(old, "Created")
    if gang_planned:  # the counts decide() assumed for a created gang
        status["workers"] = copy.deepcopy(old.get("workers") or status.get("workers"))
    b = StatusBuilder(status, now)
    events = [e for e in plan.events if not (gang_planned and e[1] == "GangCreated")]
    b.condition("NameConflict", bool(outcome.conflicts), "NameConflict" if outcome.conflicts else "NamesFree",
                "; ".join(outcome.conflicts) or "every name this job needs is free")
    spec = plan.spec
    left: float | None = None
    message = ""
    if outcome.rejected:
        timeout = spec.run_policy.child_rejected_timeout_seconds if spec is not None else 0
        detail = "; ".join(outcome.rejected)
        b.condition("ChildRejected", True, "ChildRejected",
                    f"{detail} (retrying with backoff for runPolicy.childRejectedTimeoutSeconds={timeout}s)")
        since = parse_time((_condition(b.status, "ChildRejected") or {}).get("lastTransitionTime")) or now
        left = (since + timedelta(seconds=timeout) - now).total_seconds()
        if left <= 0:
            msg = (f"the API server rejected the job's children for {timeout}s "
                   f"(runPolicy.childRejectedTimeoutSeconds): {detail}; fix the spec (or the namespace's quota or "
                   "policy) and create the job again")
            b.condition("Failed", True, "ChildRejected", msg)
            b.condition("Running", False, "ChildRejected", msg)
            b.phase(FAILED, msg)
            b.status["completionTime"] = format_time(now)
            return dataclasses.replace(plan, status=b.status, events=events + b.events, create=False,
                                       delete_pods=sorted(set(plan.delete_pods) | set(ours)),
                                       delete_servers=True), None
        message = f"the API server rejects the job's children: {detail}"
    elif outcome.conflicts:
        message = f"waiting for names to be free: {'; '.join(outcome.conflicts)}"
    else:
        message = f"waiting for the garbage collector to delete {', '.join(outcome.waiting)} of an earlier job " \
                  "with this name"
    if gang_planned:
        b.phase(RESTARTING if old.get("phase") == RESTARTING else PENDING, message)
    else:  # a running job replacing one pod: it keeps its phase
        b.status["message"] = message
    return dataclasses.replace(plan, status=b.status, events=events + b.events, create=False), left
