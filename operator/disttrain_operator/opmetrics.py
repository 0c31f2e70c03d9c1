"""The operator's own Prometheus metrics (prefix disttrain_operator_; names in disttrain_api/metric_names.py)."""

from __future__ import annotations

import threading

from disttrain_api import metric_names as n
from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge(n.OPERATOR_JOBS, "DistTrainJobs known to this operator, by phase.", ["phase"])
RECONCILE_SECONDS = Histogram(
    n.OPERATOR_RECONCILE_SECONDS,
    "Wall time of one reconcile of one job (API calls included).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
RECONCILE_ERRORS = Counter(n.OPERATOR_RECONCILE_ERRORS, "Reconciles that raised.")
RESTARTS = Counter(n.OPERATOR_GANG_RESTARTS, "Gang re-creations, by reason.", ["reason"])
API_REQUESTS = Counter(
    n.OPERATOR_API_REQUESTS,
    "Kubernetes API requests made by the reconciler (kopf's own watches and patches excluded).",
    ["verb", "resource"],
)
STATUS_WRITES = Counter(
    n.OPERATOR_STATUS_WRITES,
    "Job status writes: transitions (phase, conditions, restarts) or progress alone (pod counts, steps).",
    ["kind"],
)

# spec.faultTolerance: replicas replaced alone, and quorums that grew back (Events ReplicaLost, ReplicaJoined).
FT_REPLICAS_LOST = Counter(n.OPERATOR_FT_REPLICAS_LOST, "Fault-tolerant replicas lost and replaced alone.",
                           ["namespace", "job"])  # fmt: skip
FT_REPLICAS_JOINED = Counter(n.OPERATOR_FT_REPLICAS_JOINED,
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
    for p, count in counts.items():
        JOBS.labels(phase=p).set(count)
