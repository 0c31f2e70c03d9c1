"""The data mode's run state: model, optimizer, sampler, RNG streams and the checkpoints that
carry them, whole (rank 0, written in the background) or sharded (every rank, DCP).

A sharded model (tensor parallel, FSDP: DTensor parameters) is saved by every rank into a DCP
checkpoint (checkpoints/sharded.py); a replicated one by rank 0 alone (checkpoints/whole.py).
Either format resumes into either kind of model, at any layout (`resume`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint import CheckpointException

from ...checkpoints import rank_state, resume
from ...checkpoints import sharded as sharded_ckpt
from ...checkpoints import whole as ckpt
from ...checkpoints.fence import Writer
from ...data import Dataset, GlobalBatchSampler
from ...parallel.comm_profile import ProfiledComm
from ...parallel.ddp import CommClock
from ...parallel.hybrid import is_sharded
from ...parallel.sync import OuterSync
from ...process.config import TrainerConfig
from ...process.dist_env import DistContext
from ...process.precision import Amp
from ...process.stop_agreement import StopAgreement
from ...run_common import loss_fn_for
from ...telemetry import scaling_record
from ...telemetry.step_metrics import Metrics, Tally
from . import layouts


@dataclass(kw_only=True)
class Run:
    cfg: TrainerConfig
    ctx: DistContext
    ds: Dataset
    model: nn.Module  # the wrapped model (DDP, or the sharded module itself)
    inner: nn.Module  # the module whose state checkpoints hold (sharded in place on a mesh)
    comm: CommClock | ProfiledComm | None  # None: nothing to time (or metrics off)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    amp: Amp
    sampler: GlobalBatchSampler
    metrics: Metrics
    step: int = 0
    resumed_from: int | None = None
    # Set once training is over: the final checkpoint carries it, so a resumed run
    # that has nothing left to do reports the finished run's figures.
    summary: dict[str, Any] | None = None
    totals: Tally = field(default_factory=Tally)
    scaling: scaling_record.ScalingRecorder = field(default_factory=scaling_record.ScalingRecorder)
    saver: ckpt.AsyncSaver | None = None  # rank 0's background checkpoint writer
    stop: StopAgreement | None = None  # when every rank stops on request (None: trains to the end)
    saved_step: int | None = None  # the step of the newest checkpoint this run wrote or resumed from
    _gather: rank_state.PendingGather | None = None  # the last checkpoint's per-rank parts, possibly in flight
    outer: OuterSync | None = None  # training.sync localsgd / diloco: the sync every interval steps

    @property
    def sharded(self) -> bool:
        return is_sharded(self.inner)

    def state(self) -> dict[str, Any]:
        """Everything a resume needs; a sharded model's model and optimizer go to DCP instead."""
        return {**self._own_state(), **self._rank_parts(rank_state.gather_now(self._rank_part(), self.ctx.world_size, self.ctx.device))}

    def _own_state(self) -> dict[str, Any]:
        """The state without the per-rank parts (RNG streams, comm-hook state)."""
        weights = {} if self.sharded else {"model": self.inner.state_dict(), "optimizer": self.optimizer.state_dict()}
        return {
            "step": self.step,
            "world_size": self.ctx.world_size,
            "layout": layouts.layout(self.cfg).describe(),
            **weights,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.amp.scaler.state_dict() if self.amp.scaler is not None else None,
            "sampler": self.sampler.state_dict(),
            "summary": self.summary,
            "sync": self.outer.state_dict() if self.outer is not None else None,
            "spec_data": {
                "batch_size": self.cfg.spec.data.batch_size,
                "seed": self.cfg.spec.data.seed,
            },
        }

    def full_model_state(self) -> dict[str, Any] | None:
        """The model's full tensors on rank 0 (None elsewhere); collective for a sharded model."""
        if self.sharded:
            state = sharded_ckpt.full_model_state(self.inner)
            return state if self.ctx.is_main else None
        return self.inner.state_dict() if self.ctx.is_main else None

    def _rank_part(self) -> tuple[Any, Any]:
        """This rank's RNG streams (dropout) and comm hook error feedback (PowerSGD)."""
        return rank_state.rng_state(), rank_state.hook_state(self.comm_hook_state)

    @staticmethod
    def _rank_parts(gathered: rank_state.PendingGather) -> dict[str, Any]:
        per_rank = gathered.result()
        return {"rng": [r for r, _ in per_rank], "comm_hook": [h for _, h in per_rank]}

    def restore(self, state: dict[str, Any]) -> None:
        """`state` without model and optimizer: checkpoints/sharded.py has restored those."""
        if "model" in state:
            self.inner.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = self.resumed_from = self.saved_step = int(state["step"])
        self.summary = state.get("summary")
        if self.outer is not None:  # without a saved anchor (an every-step checkpoint): the loaded weights
            self.outer.load_state_dict(state.get("sync") or {"anchor": [p.detach() for p in self.outer.params]})
        layout = layouts.layout(self.cfg).describe()
        # Checkpoints without a layout were written by data parallel over their whole world.
        saved_layout = state.get("layout", f"dp={len(state['rng'])},pp=1,tp=1")
        if len(state["rng"]) == self.ctx.world_size and saved_layout == layout:
            # Same gang shape: each rank continues its own streams.
            rank_state.set_rng_state(state["rng"][self.ctx.rank])
            hooks = state.get("comm_hook") or [None] * self.ctx.world_size
            rank_state.load_hook_state(self.comm_hook_state, hooks[self.ctx.rank], self.ctx.device)
        else:  # resharded: no saved stream belongs to this rank; error feedback starts empty
            rank_state.seed_rank(self.cfg.spec.data.seed, self.step, layouts.rng_stream(self.cfg, self.ctx.rank))

    @property
    def comm_hook_state(self) -> Any:
        return getattr(self.model, "comm_hook_state", None)

    def save_checkpoint(self) -> None:
        """Snapshot the state; rank 0 hands it to the background writer (at most one write in flight).

        Every rank launches the gather of its RNG streams (rank_state.gather_async) and goes on; rank 0
        copies the state while that collective runs, and its writer thread waits for it. The caller
        times this and the barrier after it as idle time, not as communication.
        A sharded model's checkpoint is written by every rank, synchronously (DCP)."""
        self.saved_step = self.step
        if self.sharded:
            state = self.state()
            res = sharded_ckpt.save(self.cfg.checkpoint_dir, self.step, model=self.inner, optimizer=self.optimizer,
                                    extra=state, keep=self.cfg.spec.checkpoint.keep,
                                    layout=layouts.layout(self.cfg).describe())  # fmt: skip
            self.metrics.observe_checkpoint(self.step, res.seconds, res.bytes)
            return
        self.finish_gather()  # the previous checkpoint's gather: at most one in flight
        part = self._rank_part()
        # PowerSGD's error feedback is model-sized: gathered synchronously; RNG streams alone fit a slot.
        ws = self.ctx.world_size
        dev = self.ctx.device
        pending = rank_state.gather_now(part, ws, dev) if part[1] is not None else rank_state.gather_async(part, ws, dev)
        if not self.ctx.is_main:
            self._gather = pending  # its send buffer lives until the collective completes
            return
        if self.saver is None:
            self.saver = ckpt.AsyncSaver(self.cfg.checkpoint_dir, keep=self.cfg.spec.checkpoint.keep,
                                         world_size=self.ctx.world_size)  # fmt: skip
        # Rank 0's writer thread waits for the gather just before writing (the saver joins it).
        stall = self.saver.save(self._own_state(), self.step, complete=lambda: self._rank_parts(pending))
        self.metrics.observe_checkpoint_stall(self.step, stall)

    def finish_gather(self) -> None:
        """Wait for this rank's part in the last checkpoint's gather (ranks other than 0)."""
        if self._gather is not None:
            self._gather.result()
            self._gather = None

    def report_checkpoints(self, *, wait: bool = False) -> None:
        """Record the checkpoints whose background write has finished (rank 0); `wait` for the one in flight."""
        if wait:
            self.finish_gather()
        if self.saver is None:
            return
        for res in self.saver.wait() if wait else self.saver.poll():
            step = int(res.path.name.rsplit("-", 1)[1])
            self.metrics.observe_checkpoint(step, res.seconds, res.bytes)


def _settle_buckets(run: Run) -> None:
    """One throw-away forward/backward so DDP lays out its gradient buckets before a restore.

    DDP rebuilds its buckets after the first backward, in the order gradients became
    ready; PowerSGD's saved residuals and factors are flat tensors in that later layout.
    Without this the first step after a resume adds them to a differently ordered
    bucket. Everything the pass touches (gradients, hook state, RNG, timers) is reset or
    restored afterwards; parameters do not change (no optimizer step).
    """
    per_rank = run.cfg.spec.data.batch_size // run.ctx.world_size
    micro = per_rank // run.cfg.spec.training.grad_accumulation
    x, y = run.ds.batch(np.arange(micro))
    dev = run.ctx.device
    with run.amp.autocast():
        loss = loss_fn_for(run.ds)(run.model(torch.from_numpy(np.asarray(x)).to(dev)),
                                   torch.from_numpy(np.asarray(y)).to(dev))  # fmt: skip
    loss.backward()
    run.optimizer.zero_grad(set_to_none=True)
    if run.comm is not None:
        run.comm.take()


def resume_newest(run: Run) -> None:
    """The newest checkpoint of either format into this run's model, whatever layout wrote it."""
    state = _load_agreed(run)
    if state is None:
        return
    run.restore(state)
    if run.ctx.is_main:
        print(f"disttrain-trainer: resumed from step {run.step} ({run.cfg.checkpoint_dir})", flush=True)


def _load_agreed(run: Run) -> dict[str, Any] | None:
    """Model and optimizer loaded from the checkpoint the gang agreed on; the rest of its state."""
    writer = Writer.of(run.cfg)
    while True:
        loaded = resume.agree_on_checkpoint(run.cfg.checkpoint_dir, run.ctx, writer=writer, sharded=True)
        if loaded is None:
            return None
        saved = loaded[1]
        if isinstance(saved, Path):  # DCP: every rank reads the byte ranges its own shards need
            try:
                return sharded_ckpt.load(saved, model=run.inner, optimizer=run.optimizer)
            except CheckpointException as e:  # raised on every rank alike: all fall back together
                resume.reject(saved, run.ctx, e)
                continue  # the next checkpoint's load overwrites whatever this one half-loaded
        if run.sharded:  # every rank holds the full tensors; each keeps its own shard of them
            return sharded_ckpt.load_full(saved, model=run.inner, optimizer=run.optimizer)
        hooks = saved.get("comm_hook") or []
        if len(hooks) == run.ctx.world_size and any(h is not None for h in hooks):
            _settle_buckets(run)
        return saved


