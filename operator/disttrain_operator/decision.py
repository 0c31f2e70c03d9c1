"""What the reconciler's decision reads (Observed: the job and the pods that exist) and writes
(Plan: the next status and what to create or delete), the builder of that status with its
conditions and Events, and the two actions every phase may take: force-deleting Terminating
pods that run nothing or that their node cannot confirm deleted, and restarting the gang.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from disttrain_api import progress as job_progress
from disttrain_api.model import JobSpec

from .observe import ClaimView, PodView, format_time

# Phases (DESIGN.md): Pending | Running | Restarting | Succeeded | Failed | Suspended
PENDING, RUNNING, RESTARTING = "Pending", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
TERMINAL = (SUCCEEDED, FAILED)
IMMUTABLE_FIELDS = ("mode", "model", "parallelism")
# The reason (condition, Event) of a gang restart or pod replacement caused by a disruption.
DISRUPTED = "Disrupted"
# The reason of a gang restart that puts the pods on new Secrets (job_secrets.py): routine.
SECRETS_RENEWED = "SecretsRenewed"
# Defaults of the TLS certificates the operator mints (settings.py): valid a year, renewed a month ahead.
TLS_VALID_S = 365 * 86400.0
TLS_RENEW_BEFORE_S = 30 * 86400.0
# Conditions about the checkpoint volume (checkpoint_status.py); each posts a Warning Event
# when it turns True: a job that would lose its progress, or cannot start, until someone acts.
CHECKPOINTS_EPHEMERAL = "CheckpointsEphemeral"
CHECKPOINT_CLAIM_PENDING = "CheckpointClaimPending"


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
    progress: dict[str, Any] | None = None  # rank 0's PROGRESS_SERIES (+ scraper.FORECAST: its forecast)
    progress_time: datetime | None = None  # when that reading was taken (status.progress measures from it)
    now: datetime
    force_delete_after_s: float = 30.0
    node_lost_after_s: float = 300.0  # settings.NODE_LOST_AFTER_S: Kubernetes' pod-eviction default
    # UIDs of pods this operator deleted lately (expectations.py): a pod deleted by
    # anyone else (a drain, an eviction, a user) is a disruption, not a failure.
    deleted_by_operator: frozenset[str] = frozenset()
    # How long before its TLS certificate expires the gang moves to a new one (settings).
    tls_renew_before_s: float = TLS_RENEW_BEFORE_S
    # The job's own checkpoint claim (checkpoint_claim.py) as read while the gang starts; None
    # when the job has none, or it was seen Bound already (it is not read again then).
    claim: ClaimView | None = None
    claim_pending_after_s: float = 120.0  # settings.CLAIM_PENDING_AFTER_S


@dataclass(frozen=True, kw_only=True)
class Plan:
    status: dict[str, Any]
    spec: JobSpec | None = None  # effective spec (immutable fields from the accepted spec)
    create: bool = False  # create the gang at status.attempt / status.replicas
    delete_pods: list[str] = field(default_factory=list)
    force_delete_pods: list[str] = field(default_factory=list)
    delete_servers: bool = False  # federated/paramserver Deployment
    delete_job: bool = False  # ttlSecondsAfterFinished expired
    # Secrets (credentials.IDENTITY, TLS) to create under fresh names and record in status.secrets
    # before the gang may be created (job_secrets.py); nothing else happens in such a reconcile.
    mint_secrets: tuple[str, ...] = ()
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (Normal|Warning, reason, message)


# Conditions that record a state the job reached by itself, not something the operator did
# or a problem: the condition (with its lastTransitionTime) is the record, and no Event is
# posted. Events say what the operator did (created, deleted, restarted, replaced, resized,
# suspended, resumed a gang) and every failure, so a healthy job costs one Event, not one
# per phase.
STATE_CONDITIONS = ("Running", "Succeeded")


class StatusBuilder:
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
        warn = (type_ in ("Failed", "InvalidSpec", "Restarting", "NameConflict", "ChildRejected",
                          CHECKPOINTS_EPHEMERAL, CHECKPOINT_CLAIM_PENDING)
                or reason in ("Unschedulable",)) and reason not in (DISRUPTED, SECRETS_RENEWED)
        self.event("Warning" if warn else "Normal", reason, message or type_)

    def event(self, kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    def phase(self, value: str, message: str = "") -> None:
        self.status["phase"] = value
        self.status["message"] = message


def stuck(pods: list[PodView], obs: Observed) -> list[str]:
    """Terminating pods to force-delete: those whose containers have all stopped, and those
    Terminating for too long (their node is gone and cannot confirm).

    A stopped pod runs nothing, but its API object stays until its kubelet has removed its
    sandbox; a 1.20 kubelet sometimes leaves that to its container garbage collector, which runs
    once a minute, and the next gang, which reuses the pods' names, would wait for it."""
    return [p.name for p in pods if p.deleting and (p.stopped or p.deleting_for_s >= obs.force_delete_after_s)]


def restart(
    b: StatusBuilder,
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
    if st.get("progress"):  # the new gang's first reading starts the next rate window, not this gang's last
        st["progress"] = job_progress.restarted(st["progress"])
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


