"""spec.faultTolerance (per-step fault tolerance of data-parallel replicas) and spec.training.sync
(how often replicas synchronise: every step, or LocalSGD / DiLoCo every `interval` steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..dataparse import fld

SyncKind = Literal["every-step", "localsgd", "diloco"]
OuterOptim = Literal["sgd", "nesterov"]
# Committed steps between two quorums unless quorumIntervalSteps says otherwise: the lighthouse round
# trip of the other nine is saved (on a step of milliseconds, most of what fault tolerance costs), and
# a replacement joins at most ten steps later than it would (seconds, beside the minutes a pod takes).
QUORUM_INTERVAL_STEPS = 10
# A replica heartbeats to the lighthouse this many times within heartbeatTimeoutSeconds, at most
# once every HEARTBEAT_MAX_INTERVAL_S. torchft's default is every 100 ms whatever the timeout (50 a
# timeout at the default 5 s): each heartbeat is a gRPC call through the replica's Manager server and
# the lighthouse, whose threads took 0.48 ms of CPU per step of the digits MLP (four replicas on a
# 2-core host, per-thread CPU from /proc) at 100 ms and 0.24 at 500 ms. Ten a timeout is plenty to
# tell a live replica from a dead one (a Kubernetes node renews its lease 4 times in its 40 s).
HEARTBEATS_PER_TIMEOUT = 10
HEARTBEAT_MAX_INTERVAL_S = 1.0


@dataclass(frozen=True, kw_only=True)
class FaultToleranceSpec:
    enabled: bool = fld(
        True,
        desc="Each worker pod is a replica group of its own; a failed replica is dropped from the all-reduce at "
        "the next step while the others go on, and its replacement receives the weights and optimizer state "
        "from a healthy peer (torchft). false: today's gang restart from the checkpoint.",
    )
    min_replicas: int = fld(
        1, minimum=1,
        desc="Fewest healthy replicas that may go on training; below it the whole gang restarts from the newest "
        "checkpoint.",
    )
    heartbeat_timeout_seconds: int = fld(
        5, minimum=1, maximum=600,
        desc="A replica whose heartbeat to the job's lighthouse is older than this is dropped from the next "
        f"quorum; also how long a collective waits for a silent peer. Survivors step again within about this. A "
        f"replica heartbeats {HEARTBEATS_PER_TIMEOUT} times per this timeout, at most once every "
        f"{HEARTBEAT_MAX_INTERVAL_S:g} s.",
    )
    quorum_interval_steps: int | None = fld(
        None, minimum=1, maximum=1000,
        desc=f"Committed steps between two quorums from the lighthouse while every step commits (training.sync "
        f"every-step; default {QUORUM_INTERVAL_STEPS}). A step that fails asks for a new quorum at once whatever "
        "this is, so survivors go on as fast; a replacement joins at the next quorum, up to this many steps "
        "later. 1 asks every step: the quorum is a round trip through the lighthouse, a large share of a step "
        "that takes milliseconds.",
    )

    @property
    def quorum_interval(self) -> int:
        return self.quorum_interval_steps or QUORUM_INTERVAL_STEPS


@dataclass(frozen=True, kw_only=True)
class OuterOptimizerSpec:
    name: OuterOptim = fld(
        "nesterov", desc="diloco: the optimizer of the averaged pseudo-gradients: sgd, or nesterov (SGD with Nesterov momentum)."
    )
    lr: float = fld(0.7, minimum=0.0, exclusive_minimum=True, desc="diloco: the outer learning rate (DiLoCo: 0.7).")
    momentum: float = fld(0.9, minimum=0.0, maximum=1.0, desc="diloco: the outer momentum (nesterov; DiLoCo: 0.9).")


@dataclass(frozen=True, kw_only=True)
class SyncSpec:
    kind: SyncKind = fld(
        "every-step",
        desc="every-step: gradients are all-reduced every step (DDP). localsgd: each replica steps on its own "
        "and the parameters are averaged every interval steps. diloco: the same, and the averaged change "
        "(a pseudo-gradient) is applied by outerOptimizer (Douillard et al. 2023). Mode data with ddp.",
    )
    interval: int = fld(50, minimum=1, desc="localsgd, diloco: inner steps between two synchronisations (H).")
    outer_optimizer: OuterOptimizerSpec = fld(factory=OuterOptimizerSpec, desc="diloco: the outer optimizer.")
    every_step_first: int = fld(
        0, minimum=0,
        desc="localsgd, diloco: the first this many steps all-reduce the gradients every step (DDP), then the "
        "replicas step apart from the model they reached (post-local SGD, Lin et al. 2020). Replicas that step "
        "apart from the first step gain little from each other's samples early in training; a multiple of "
        "interval, below training.steps.",
    )

    @property
    def every(self) -> int:
        """Steps between two synchronisations once the replicas step apart: 1 for every-step."""
        return 1 if self.kind == "every-step" else self.interval

    def every_step_at(self, step: int) -> bool:
        """Whether the step numbered `step` (1-based) all-reduces its gradients."""
        return self.kind == "every-step" or step <= self.every_step_first

    def sync_at(self, step: int) -> bool:
        """Whether the step numbered `step` (1-based) of a localsgd / diloco job ends with a sync."""
        return self.kind != "every-step" and step > self.every_step_first and step % self.interval == 0

    def all_reduces(self, first: int, last: int) -> int:
        """All-reduces of the model's size in steps first..last (1-based, inclusive); counted once per
        log interval, over its steps."""
        return sum(1 for k in range(first, last + 1) if self.every_step_at(k) or self.sync_at(k))
