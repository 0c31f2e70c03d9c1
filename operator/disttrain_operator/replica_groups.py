"""spec.faultTolerance in the reconciler's decision: whether a lost replica pod is replaced alone
(the other replicas train on at a smaller quorum) or the gang restarts (fewer than minReplicas
left), and status.replicaGroups with its Events.

- healthy: replica pods of the current attempt that run and have not failed (or have finished);
- quorum / quorumId: the quorum of the latest step as a replica reported it (its metrics: the
  lowest-index running replica is scraped, reconcile._progress_source);
- lost: replicas replaced alone so far (Event ReplicaLost, counter disttrain_operator_ft_replicas_lost_total);
- joined: replicas the quorum grew back by under a new quorum id, a replacement having recovered
  from a live peer (Event ReplicaJoined, counter disttrain_operator_ft_replicas_joined_total). Only
  a replica lost before can rejoin: growth beyond `lost - joined` is the gang still gathering at
  its start (a first reading of 0, replicas importing torch later than minReplicas others), not a
  rejoin.
"""

from __future__ import annotations

from typing import Any

from disttrain_api import metric_names as names
from disttrain_api.model import JobSpec

from .decision import Observed, StatusBuilder
from .observe import PodView

LOST, JOINED = "ReplicaLost", "ReplicaJoined"


def healthy(current: list[PodView], obs: Observed, failure: Any) -> list[PodView]:
    """Replica pods that train (Running) or finished, and have not failed."""
    return [p for p in current if p.phase in ("Running", "Succeeded") and not p.deleting
            and not failure(p, obs.node_lost_after_s)]  # fmt: skip


def replace_alone(spec: JobSpec, current: list[PodView], obs: Observed, failure: Any) -> bool:
    """Whether the failed replicas may be replaced alone: at least minReplicas others remain."""
    ft = spec.fault_tolerance
    return ft is not None and len(healthy(current, obs, failure)) >= ft.min_replicas


def note_lost(st: dict[str, Any], count: int) -> None:
    rg = dict(st.get("replicaGroups") or {})
    rg["lost"] = int(rg.get("lost") or 0) + count
    st["replicaGroups"] = rg


def forget_quorum(st: dict[str, Any]) -> None:
    """A gang restart: the next quorum is a new gang's, not a replica rejoining."""
    rg = dict(st.get("replicaGroups") or {})
    rg.pop("quorumId", None)
    rg["quorum"] = 0
    st["replicaGroups"] = rg


def update(b: StatusBuilder, spec: JobSpec, current: list[PodView], obs: Observed, failure: Any) -> None:
    """status.replicaGroups from the pods and the latest reading; ReplicaJoined when the quorum grew."""
    st = b.status
    rg = dict(st.get("replicaGroups") or {})
    rg["healthy"] = len(healthy(current, obs, failure))
    rg.setdefault("quorum", 0)
    rg.setdefault("lost", 0)
    rg.setdefault("joined", 0)
    reading = obs.progress or {}
    if names.FT_QUORUM_SIZE in reading and names.FT_QUORUM_ID in reading:
        q, qid = int(reading[names.FT_QUORUM_SIZE]), int(reading[names.FT_QUORUM_ID])
        before, before_id = int(rg.get("quorum") or 0), rg.get("quorumId")
        rejoined = min(q - before, int(rg["lost"]) - int(rg["joined"]))
        if before_id is not None and qid != before_id and rejoined > 0:
            rg["joined"] = int(rg["joined"]) + rejoined
            b.event("Normal", JOINED, f"the quorum grew from {before} to {q} of {spec.workers.replicas} replicas "
                                      f"(quorum {qid}): {rejoined} replacement(s) recovered from a live peer and "
                                      "train again")  # fmt: skip
        rg["quorum"], rg["quorumId"] = q, qid
    st["replicaGroups"] = rg
