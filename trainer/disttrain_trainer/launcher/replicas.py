"""`disttrain local` with spec.faultTolerance: each replica its own process group, the job's
lighthouse a process of its own, and a failed replica replaced alone while the others go on.

The environment is the operator's for fault-tolerant pods (disttrain_api.constants): every replica
group is a world of its own (WORLD_SIZE procsPerWorker, RANK its process's index in the group: one
process with ddp, an HSDP group with fsdp) whose store listens on its own MASTER_PORT,
DISTTRAIN_FT_REPLICA is its replica index, and TORCHFT_LIGHTHOUSE names the lighthouse. The
lighthouse is one more process (rank = world size, log rank{W}.log) in role lighthouse; it never
ends by itself, so the launcher treats it as optional to the gang's success and starts it again if
it dies.

When a process fails (`decide`): a config error fails the job; otherwise, if at least minReplicas
replica groups are still running (or have finished), only its group is started again (with a fresh
store port; the group's other processes, whose world died with it, are killed first) and recovers
from a live peer: counted against runPolicy.backoffLimit like a restart, or as a disruption when
it stopped on request (SIGTERM). Fewer than minReplicas left: the gang restarts from the newest
checkpoint, as without fault tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_api.model import JobSpec

from disttrain_trainer.launcher.env import LOCALHOST, Slot, reserve_ports
from disttrain_trainer.launcher.gang import Failure, Gang
from disttrain_trainer.launcher.progress import JsonlTail, metrics_path

Action = Literal["replace", "gang", "fail"]


def lighthouse_rank(spec: JobSpec) -> int:
    return spec.world_size


def replica_envs(envs: Sequence[tuple[Slot, dict[str, str]]], *, procs: int, store_ports: Sequence[int],
                 lighthouse_port: int, metrics_port: int) -> list[tuple[Slot, dict[str, str]]]:  # fmt: skip
    """Every `procs` consecutive gang processes a replica group of their own (one store port per
    group), plus the lighthouse process (last)."""
    url = f"http://{LOCALHOST}:{lighthouse_port}"
    out = []
    for s, e in envs:
        replica, group_rank = divmod(s.rank, procs)
        out.append((s, {**e, C.ENV_MASTER_PORT: str(store_ports[replica]), C.ENV_WORLD_SIZE: str(procs),
                        C.ENV_RANK: str(group_rank), C.ENV_LOCAL_RANK: str(group_rank),
                        C.ENV_NPROC_PER_NODE: str(procs), C.ENV_NODE_RANK: "0", C.ENV_FT_REPLICA: str(replica),
                        C.ENV_FT_LIGHTHOUSE: url}))  # fmt: skip
    if not envs:
        return out
    _, first = out[0]
    lh = Slot(rank=len(envs), local_rank=0, node_rank=0)
    lh_env = {**first, C.ENV_ROLE: C.ROLE_LIGHTHOUSE, C.ENV_METRICS_PORT: str(metrics_port)}
    return [*out, (lh, lh_env)]


def decide(failure: Failure, *, healthy: int, min_replicas: int, restarts: int, backoff_limit: int) -> Action:
    """What a failed replica costs: `healthy` = the other replicas still running or finished."""
    if failure.returncode in exitcodes.PERMANENT:
        return "fail"
    if healthy < min_replicas:
        return "gang"
    if failure.disruption or restarts < backoff_limit:
        return "replace"
    return "fail"


@dataclass
class Watch:
    """A replaced replica, watched (its group's first process) until its log says it recovered from a live peer."""

    rank: int  # the replica index
    tail: JsonlTail


class ReplicaSet:
    """The fault-tolerant side of one attempt: replaces replicas, restarts the lighthouse, and says
    when a replacement has rejoined."""

    def __init__(self, spec: JobSpec, gang: Gang, run_dir: Path) -> None:
        self.spec, self.gang, self.run_dir = spec, gang, run_dir
        self.procs = spec.workers.procs_per_worker
        self.lighthouse = lighthouse_rank(spec)
        self.watching: list[Watch] = []

    @property
    def optional(self) -> frozenset[int]:
        return frozenset({self.lighthouse})

    def replica_of(self, rank: int) -> int:
        return rank // self.procs

    def ranks_of(self, replica: int) -> range:
        return range(replica * self.procs, (replica + 1) * self.procs)

    def healthy_besides(self, replica: int) -> int:
        """Replica groups other than `replica` whose processes all run or finished (exit 0)."""
        states = self.gang.states()
        return sum(1 for g in range(self.spec.workers.replicas)
                   if g != replica and all(states[r] in (None, 0) for r in self.ranks_of(g)))  # fmt: skip

    def replace(self, replica: int) -> None:
        """Start replica group `replica` again, on a fresh store port; its processes still running
        (an HSDP group whose peer died: their world is gone) are killed first."""
        ranks = self.ranks_of(replica)
        self.gang.kill(ranks)
        port = str(reserve_ports(1)[0])
        for rank in ranks:
            self.gang.replace(rank, env={C.ENV_MASTER_PORT: port})
        tail = JsonlTail(metrics_path(self.run_dir, ranks[0]))
        tail.read_new()  # only what the replacement writes
        self.watching.append(Watch(rank=replica, tail=tail))

    def lighthouse_lost(self) -> Failure | None:
        """The lighthouse's failure once, if it died (it is then started again)."""
        lost = self.gang.lost.pop(self.lighthouse, None)
        if lost is not None:
            self.gang.replace(self.lighthouse)
        return lost

    def rejoined(self) -> list[str]:
        """Lines for replacements that recovered from a live peer since the last call."""
        lines: list[str] = []
        for w in list(self.watching):
            for rec in w.tail.read_new():
                if rec.get("event") == "recovered":
                    lines.append(f"replica {w.rank} rejoined: it recovered step {rec.get('step')} from a live peer in "
                                 f"{float(rec.get('seconds', 0.0)):.1f} s")  # fmt: skip
                    self.watching.remove(w)
                    break
        return lines


@dataclass
class Counts:
    restarts: int
    disruptions: int


def handle(rs: ReplicaSet, outcome: Failure | bool, counts: Counts, *, note: Callable[[str], None]) -> Failure | bool:
    """One poll's outcome with fault tolerance: False (go on) after replacing a replica or the
    lighthouse alone; the outcome itself when the gang must restart, fail or has succeeded."""
    if (lost := rs.lighthouse_lost()) is not None:
        note(f"the lighthouse died ({lost.reason}); starting it again (the replicas wait for it)")
    for line in rs.rejoined():
        note(line)
    if not isinstance(outcome, Failure):
        return outcome
    ft = rs.spec.fault_tolerance
    assert ft is not None
    limit = rs.spec.run_policy.backoff_limit
    replica = rs.replica_of(outcome.rank)
    healthy = rs.healthy_besides(replica)
    action = decide(outcome, healthy=healthy, min_replicas=ft.min_replicas, restarts=counts.restarts,
                    backoff_limit=limit)  # fmt: skip
    if action == "gang":
        note(f"replica {replica} lost ({outcome.reason}); {healthy} replicas left, fewer than "
             f"faultTolerance.minReplicas={ft.min_replicas}: the gang restarts from the newest checkpoint")
        return outcome
    if action == "fail":
        return outcome
    if outcome.disruption:  # exit 3 after a SIGTERM this launcher sent (gang.py)
        counts.disruptions += 1
        why = f"disruption {counts.disruptions}, not counted as a restart"
    else:
        counts.restarts += 1
        why = f"restart {counts.restarts}/{limit}"
    note(f"replica {replica} lost ({outcome.reason}); the other {healthy} go on at a smaller quorum, "
         f"replacing only this replica ({why})")
    rs.replace(replica)
    return False
