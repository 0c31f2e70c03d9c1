"""A fault-tolerant replica's run state: what a joining peer receives from a live one, what the
periodic checkpoint holds, and the rule that scales the learning rate to the quorum.

The healed state and the checkpoint carry the same parts (model, optimizer, scheduler, scaler,
sampler, step, the gradient bucket layout and the LocalSGD/DiLoCo anchor); the checkpoint is shaped
like the data mode's own (run_state.Run.state), so a job that turns fault tolerance off resumes from
it, and back. An HSDP replica group (a model sharded over its processes) heals shard by shard from
the same group rank of a live group (parallel/ft_hsdp.py), and checkpoints whole: its processes
gather the full tensors, group rank 0 writes them.

Global batch and learning rate at a smaller quorum (README "Fault tolerance"): every replica keeps
its own batch (data.batchSize / workers.replicas), so the global batch of a step is quorum x that,
and the learning rate follows optimizer.scaleLR over quorum / replicas (linear: lr x q / N). The
gradient is the mean over the quorum's batches (torchft divides by the participants), the same
estimate from fewer samples; linear scaling keeps the update per sample what it was (Goyal et al.
2017), so the survivors neither slow down (no replica takes over another's rows) nor overshoot.
A missing replica's rows of those steps are skipped, not given to others.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from disttrain_api.model import ScaleRule
from torch import nn

from ...checkpoints import rank_state
from ...checkpoints import sharded as sharded_ckpt
from ...data import Dataset, GlobalBatchSampler
from ...parallel import ft_hsdp
from ...parallel.ft_ddp import BucketLayout
from ...parallel.hybrid import is_sharded
from ...parallel.sync import OuterSync
from ...process.config import TrainerConfig
from ...process.dist_env import DistContext
from ...process.precision import Amp
from ...telemetry.step_metrics import Metrics, Tally
from .ft_checkpoints import ReplicaCheckpoints
from .ft_replica import ReplicaSettings


def quorum_lr_factor(rule: ScaleRule, quorum: int, replicas: int) -> float:
    """The learning rate's multiplier at `quorum` of `replicas` (optimizer.scaleLR: linear, sqrt, none)."""
    if quorum >= replicas or rule == "none":
        return 1.0
    ratio = max(quorum, 1) / replicas
    return ratio if rule == "linear" else math.sqrt(ratio)


def params_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes (this process's shards), in order: replicas that hold
    identical weights agree, group rank by group rank."""
    h = hashlib.sha256()
    for p in ft_hsdp.local_params(model):
        h.update(p.to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass(kw_only=True)
class ReplicaRun:
    cfg: TrainerConfig
    replica: ReplicaSettings
    ctx: DistContext
    ds: Dataset
    model: nn.Module  # what the loop calls: FTDataParallel (ddp), or the module itself (HSDP, sync kinds)
    inner: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    amp: Amp
    sampler: GlobalBatchSampler
    metrics: Metrics
    ckpts: ReplicaCheckpoints
    outer: OuterSync | None = None
    manager: Any = None  # torchft.Manager, set once the replica is ready to heartbeat
    backend: str = ""  # its process group's name (torchft-gloo, torchft-nccl), for the summary
    step: int = 0
    resumed_from: int | None = None
    summary: dict[str, Any] | None = None
    totals: Tally = field(default_factory=Tally)
    discarded: int = 0  # step attempts (or syncs) not committed
    recoveries: int = 0  # times this replica received a live peer's state
    recovery_s: float = 0.0  # the last one's duration
    healed: bool = False  # set by `load_healed` inside a quorum; the loop clears it
    # How FTDataParallel lays the gradients out: the same on every replica of a quorum, so it is
    # healed and checkpointed with the rest (a replacement may join at the step it restored).
    buckets: BucketLayout = field(default_factory=BucketLayout)

    @functools.cached_property
    def sharded(self) -> bool:
        """Whether the model is sharded (HSDP), fixed once built: asked every step, not rescanned."""
        return is_sharded(self.inner)

    def healable(self) -> dict[str, Any]:
        """What a joining replica receives from this one (torchft's checkpoint transport): this
        process's shards when the model is sharded."""
        return {
            **self._rest(),
            "model": ft_hsdp.local_state(self.inner.state_dict()),
            "optimizer": ft_hsdp.local_state(self.optimizer.state_dict()),
        }

    def _rest(self) -> dict[str, Any]:
        """The state besides model and optimizer."""
        return {
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.amp.scaler.state_dict() if self.amp.scaler is not None else None,
            "sampler": self.sampler.state_dict(),
            "sync": self.outer.state_dict() if self.outer is not None else None,
            "gradBuckets": self.buckets.state_dict(),
        }

    def load_healed(self, state: dict[str, Any]) -> None:
        if self.sharded:
            ft_hsdp.load_local_model(self.inner, state["model"])
            ft_hsdp.load_local_optimizer(self.optimizer, state["optimizer"])
        else:
            self.inner.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self._load_rest(state)
        self.healed = True

    def _load_rest(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        self.buckets.load_state_dict(state.get("gradBuckets"))  # none in the data mode's checkpoint
        if self.outer is not None:
            if state.get("sync") is not None:
                self.outer.load_state_dict(state["sync"])
            else:  # a checkpoint of every-step training: the loaded weights are the anchor
                self.outer.load_state_dict({"anchor": [p.detach() for p in self.outer.params], "outer": None})
        self.step = int(state["step"])

    def checkpoint_state(self) -> dict[str, Any]:
        """The periodic checkpoint, shaped like the data mode's whole one (run_state.Run.state).
        Collective inside an HSDP group (the full tensors are gathered; group rank 0's is the one to write)."""
        n = self.replica.processes
        if self.sharded:
            weights = {"model": sharded_ckpt.full_model_state(self.inner),
                       "optimizer": sharded_ckpt.full_optimizer_state(self.inner, self.optimizer)}  # fmt: skip
        else:
            weights = {"model": self.inner.state_dict(), "optimizer": self.optimizer.state_dict()}
        return {
            **self._rest(),
            **weights,
            "world_size": n,
            "layout": f"dp={n},pp=1,tp=1",
            "summary": self.summary,
            "spec_data": {"batch_size": self.cfg.spec.data.batch_size, "seed": self.cfg.spec.data.seed},
            # One stream, this replica's: at any other shape the data mode reseeds every rank.
            "rng": [rank_state.rng_state()],
            "comm_hook": [None],
            "ft": {"manager": self.manager.state_dict() if self.manager is not None else None},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """A checkpoint (of this format or the data mode's whole one) as this replica's starting point;
        collective inside an HSDP group (each process keeps its shards of the full tensors)."""
        if self.sharded:
            sharded_ckpt.load_full(state, model=self.inner, optimizer=self.optimizer)
        else:
            self.inner.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self._load_rest(state)
        self.resumed_from = self.step
        self.summary = state.get("summary")
        rank_state.seed_rank(self.cfg.spec.data.seed, self.step, self.replica.replica)

    def note_recovery(self, seconds: float) -> None:
        self.recoveries += 1
        self.recovery_s = seconds
        self.metrics.write({"event": "recovered", "step": self.step, "seconds": seconds})
        print(f"disttrain-trainer: replica {self.replica.replica} recovered step {self.step} from a live peer "
              f"in {seconds:.2f} s", flush=True)  # fmt: skip


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start
