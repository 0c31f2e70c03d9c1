"""The operator's own Prometheus metrics (prefix disttrain_operator_)."""

from __future__ import annotations

import threading

from disttrain_api import metric_names as names
from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("disttrain_operator_jobs", "DistTrainJobs known to this operator, by phase.", ["phase"])
RECONCILE_SECONDS = Histogram(
    "disttrain_operator_reconcile_seconds",
    "Wall time of one reconcile of one job (API calls included).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
RECONCILE_ERRORS = Counter("disttrain_operator_reconcile_errors_total", "Reconciles that raised.")
RESTARTS = Counter("disttrain_operator_gang_restarts_total", "Gang re-creations, by reason.", ["reason"])
API_REQUESTS = Counter(
    "disttrain_operator_api_requests_total",
    "Kubernetes API requests made by the reconciler (kopf's own watches and patches excluded).",
    ["verb", "resource"],
)
STATUS_WRITES = Counter(
    "disttrain_operator_status_writes_total",
    "Job status writes: transitions (phase, conditions, restarts) or progress alone (pod counts, steps).",
    ["kind"],
)

# spec.faultTolerance: replicas replaced alone, and quorums that grew back (Events ReplicaLost, ReplicaJoined).
FT_REPLICAS_LOST = Counter(names.OP_FT_REPLICAS_LOST, "Fault-tolerant replicas lost and replaced alone.",
                           ["namespace", "job"])  # fmt: skip
FT_REPLICAS_JOINED = Counter(names.OP_FT_REPLICAS_JOINED,
                             "Replicas that joined a fault-tolerant job's quorum again after recovering from a peer.",
                             ["namespace", "job"])  # fmt: skip
FT_EVENTS = {"ReplicaLost": FT_REPLICAS_LOST, "ReplicaJoined": FT_REPLICAS_JOINED}

_phases: dict[str, str] = {}
_lock = threading.Lock()
PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")


def set_phase(uid: str, phase: str | None) -> None:
    """Record a job's phase (None: the job is gone) and refresh the by-phase gauge."""
    with _lock:
        if phase is None:
            _phases.pop(uid, None)
        else:
            _phases[uid] = phase
        counts = {p: 0 for p in PHASES}
        for value in _phases.values():
            counts[value] = counts.get(value, 0) + 1
    for p, n in counts.items():
        JOBS.labels(phase=p).set(n)
