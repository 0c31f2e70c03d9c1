"""The data mode's entry (`mode: data`, `tensor`, and `hybrid` without a pipeline): check the
config, set every local rank up, resume, train, save the final checkpoint and the summary.

From the resume on, SIGTERM stops the loop at a step every rank agrees on
(process/stop_agreement.py); that step is checkpointed before the rank leaves.
"""

from __future__ import annotations

import os
import time

from disttrain_api import constants as C

from ...checkpoints import rank_state
from ...collective_rank import collective_rank, run_local_ranks
from ...data import GlobalBatchSampler
from ...models import resolve
from ...optim import build_optimizer, build_scheduler
from ...parallel import ddp
from ...parallel.sync import GroupAverager, OuterSync
from ...process import stop_request
from ...process.config import ConfigError, TrainerConfig
from ...process.dist_env import keep_until_exit
from ...process.stop_agreement import StopAgreement
from ...run_common import Summary, mark_finished, write_summary
from ...telemetry import scaling_record
from ...telemetry.step_metrics import Metrics
from ...weights.export import export_on_rank0
from . import layouts
from .loop import checkpoint_on_stop, train
from .run_state import Run, resume_newest

RUST_LOG = "RUST_LOG"


def check_supported(cfg: TrainerConfig) -> None:
    """Fail fast, before any process group exists, on what this mode cannot run."""
    spec = cfg.spec
    dp = layouts.data_shard(cfg, 0)[1]  # also checks that the degrees fit this world size
    parts = dp * spec.training.grad_accumulation
    if spec.data.batch_size % parts:
        raise ConfigError(
            f"data.batchSize {spec.data.batch_size} must be divisible by data-parallel degree {dp} x "
            f"training.gradAccumulation {spec.training.grad_accumulation} = {parts}"
        )
    resolve(spec.model.name)  # a `module:factory` that does not import fails before any rendezvous


def main(cfg: TrainerConfig) -> Summary | None:
    """The mode's entry (modes/__init__.py): every local rank of this pod; with spec.faultTolerance
    this pod's replica (fault_tolerant.py), or the job's lighthouse (role lighthouse)."""
    if cfg.spec.fault_tolerant:
        # torchft's own (Rust) log says INFO for every quorum and commit, several lines a step: only
        # its warnings, unless the user asks (RUST_LOG=info); the trainer logs quorum changes itself.
        os.environ.setdefault(RUST_LOG, "warn")
    if os.environ.get(C.ENV_ROLE) == C.ROLE_LIGHTHOUSE:
        from . import lighthouse  # noqa: PLC0415 - torchft, only in this role

        lighthouse.serve(cfg)
        return None
    check_supported(cfg)
    if cfg.spec.fault_tolerant:
        from . import fault_tolerant  # noqa: PLC0415 - torchft, only in fault-tolerant runs

        return run_local_ranks(cfg, fault_tolerant.run)
    return run_local_ranks(cfg, run)


def run(cfg: TrainerConfig, *, metrics: Metrics | None = None) -> Summary:
    """Train one rank to completion; returns the summary (rank 0 also writes summary.json)."""
    wall0 = time.perf_counter()
    check_supported(cfg)
    with collective_rank(cfg, metrics) as rank:
        spec, ctx, inner = cfg.spec, rank.ctx, rank.model
        link = scaling_record.probe_link(ctx.device, ctx.world_size)  # the forecast's link (a fraction of a second)
        wrapped = layouts.apply(inner, mesh=ctx, cfg=cfg)
        # Per-rank streams (dropout), after identical init; one stream per tensor-parallel group.
        rank_state.seed_rank(spec.data.seed, 0, layouts.rng_stream(cfg, ctx.rank))
        optimizer = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
        scheduler = build_scheduler(
            optimizer, spec.optimizer, spec.data.batch_size, spec.training.steps
        )
        dp_rank, dp = layouts.data_shard(cfg, ctx.rank)
        sampler = GlobalBatchSampler(rank.ds.num_train, spec.data.batch_size, spec.data.seed, dp_rank, dp)
        comm = layouts.comm_clock_for(wrapped) if rank.metrics.enabled else None
        r = Run(cfg=cfg, ctx=ctx, ds=rank.ds, model=wrapped, inner=inner, comm=comm, optimizer=optimizer,
                scheduler=scheduler, amp=rank.amp, sampler=sampler, metrics=rank.metrics)  # fmt: skip
        r.scaling.link = link
        if spec.training.sync.kind != "every-step":  # localsgd / diloco over the gang's process group
            r.outer = OuterSync(inner, spec.training.sync, GroupAverager())
        keep_until_exit(r)
        resume_newest(r)
        if r.outer is not None and r.outer.every_step(r.step + 1):  # sync.everyStepFirst: DDP until then
            r.model = ddp.wrap_ddp(inner, ctx=ctx, training=spec.training)
            r.comm = layouts.comm_clock_for(r.model) if rank.metrics.enabled else None
        if r.summary is not None and r.step >= spec.training.steps:
            summary = r.summary  # a finished run resumed: nothing to train, its figures stand
            if ctx.is_main:
                write_summary(cfg, summary, rank.metrics)
            mark_finished(cfg, ctx.rank, r.step)
            return summary
        r.stop = StopAgreement(grace_s=spec.run_policy.termination_grace_period_seconds)
        # From here SIGTERM stops the loop at an agreed step; once trained, the run finishes.
        with stop_request.deferred():
            summary = train(r)
            if summary is None:
                checkpoint_on_stop(r)
            summary["wallS"] = time.perf_counter() - wall0
            # Before the final checkpoint, which carries the summary naming the export.
            summary["export"] = export_on_rank0(r.full_model_state, checkpoint_dir=cfg.checkpoint_dir, spec=spec,
                                                step=r.step, is_main=ctx.is_main)  # fmt: skip
            r.summary = summary
            r.save_checkpoint()
            r.report_checkpoints(wait=True)  # the final write finishes before the trainer reports success
            if ctx.is_main:
                write_summary(cfg, summary, rank.metrics)
            mark_finished(cfg, ctx.rank, r.step)
        return summary
