"""Which pod `disttrain logs` reads: pure functions of the job's and its pods' JSON.

The pods the operator makes (operator topology/): data, pipeline, tensor and hybrid jobs a gang
of `<job>-worker-<i>`; federated jobs client pods `<job>-client-<i>` and one aggregator
Deployment's pod; parameter-server jobs worker pods and a server Deployment per shard. Every
pod carries the job's name, its role, its index (replica-index) and its gang attempt
(restart-attempt) as labels. A gang restart deletes the pods and creates them again under the
same names with the next attempt; a Deployment replaces its pod under a new name. So a pod is
found by labels, never by name, and among several (an old one still terminating, a new one) the
live one of the newest attempt wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from disttrain_api import constants as c
from disttrain_operator.topology import gang_role


@dataclass(frozen=True)
class Target:
    role: str
    index: int
    what: str  # for messages: "rank 3 (worker pod 1)", "the aggregator"

    def selector(self, job: str) -> str:
        return f"{c.LABEL_JOB}={job},{c.LABEL_ROLE}={self.role},{c.LABEL_REPLICA_INDEX}={self.index}"


def roles(job: dict[str, Any]) -> dict[str, int]:
    """The job's pod roles and how many pods each has."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    mode = spec.get("mode", "data")
    workers = int(status.get("replicas") or (spec.get("workers") or {}).get("replicas") or 1)
    found = {gang_role(mode): workers}
    if mode == "federated":
        found[c.ROLE_AGGREGATOR] = 1
    if mode == "paramserver":
        found[c.ROLE_SERVER] = int((spec.get("paramServer") or {}).get("shards") or 1)
    return found


def target_for(job: dict[str, Any], *, rank: int | None, role: str | None, index: int | None) -> Target:
    """The pod the flags name: `--rank N` (the gang pod that runs rank N), `--role R [--index I]`,
    else rank 0's pod (a federated job: its aggregator, which counts the rounds). ValueError
    says why none fits."""
    spec = job.get("spec") or {}
    mode = spec.get("mode", "data")
    have = roles(job)
    gang = gang_role(mode)
    procs = int((spec.get("workers") or {}).get("procsPerWorker") or 1)
    if rank is not None:
        world = have[gang] * procs
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not one of this job's ranks 0-{world - 1} "
                             f"({have[gang]} {gang} pods x {procs} processes)")  # fmt: skip
        return Target(gang, rank // procs, f"rank {rank} ({gang} pod {rank // procs})")
    if role is None:
        if mode == "federated":
            return Target(c.ROLE_AGGREGATOR, 0, "the aggregator")
        return Target(gang, 0, f"rank 0 ({gang} pod 0)")
    if role not in have:
        raise ValueError(f"a {mode} job has no {role} pods (its roles: {', '.join(sorted(have))})")
    i = index or 0
    if not 0 <= i < have[role]:
        raise ValueError(f"{role} index {i} is not one of 0-{have[role] - 1}")
    return Target(role, i, f"{role} {i}" if have[role] > 1 else f"the {role}")


def _attempt(pod: dict[str, Any]) -> int:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(c.LABEL_RESTART_ATTEMPT, 0))
    except ValueError:
        return 0


def owned_by(pod: dict[str, Any], job_uid: str) -> bool:
    """The job's own pod: its controller is the job (a gang pod) or a ReplicaSet (a Deployment's
    server pod; the Deployment is the job's). A pod that merely carries the job's label is not."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid") == job_uid or ref.get("kind") == "ReplicaSet"
    return False


def pick(pods: list[dict[str, Any]], job_uid: str) -> dict[str, Any] | None:
    """The live pod of the newest attempt (then the newest created) among the target's pods."""
    mine = [p for p in pods if owned_by(p, job_uid)]
    if not mine:
        return None
    return max(mine, key=lambda p: (not (p.get("metadata") or {}).get("deletionTimestamp"), _attempt(p),
                                    (p.get("metadata") or {}).get("creationTimestamp") or ""))  # fmt: skip


def container_state(pod: dict[str, Any], container: str) -> tuple[str, str]:
    """("waiting" | "running" | "terminated", reason) of the pod's container; ("waiting", phase)
    before the kubelet reports it."""
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        if st.get("name") == container:
            state = st.get("state") or {}
            for key in ("running", "terminated", "waiting"):
                if key in state:
                    return key, str((state[key] or {}).get("reason") or "")
    return "waiting", str((pod.get("status") or {}).get("phase") or "Pending")


def has_log(pod: dict[str, Any], container: str) -> bool:
    """Whether the container has started (running or ended), so the API has a log to serve."""
    return container_state(pod, container)[0] != "waiting"
