"""The pipeline mode's step loop: a step through this rank's stages, the data-parallel average of
its gradients, the time split every mode reports, and the summary.

Per step and rank the loop reports the categories every mode reports, measured:
  data    = fetching the replica's batch;
  compute = this rank's forward/backward computations plus the optimizer;
  comm    = P2P waits (inputs in flight, see stage_times.py) plus the data-parallel all-reduce;
  idle    = the rest of the step: the pipeline bubble (waiting for another stage's work), the
            schedule's own bookkeeping and waiting while rank 0 evaluates or checkpoints;
(into `Metrics`' Tally as t2 = t1 + compute + comm, comm exposed = busy, idle = end - t2)
and, per stage, the bubble of the pipeline window, its fraction and the peak of
activation memory held.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ...data import next_batch
from ...parallel.blocks import load_block_state
from ...parallel.mesh import layout_for
from ...process import stop_request
from ...process.loop_gc import LoopGC
from ...process.precision import Amp
from ...process.stop_agreement import StopAgreement
from ...run_common import SUMMARY_EVAL_KEY, evaluate
from ...telemetry import scaling_record
from ...telemetry.finish_estimate import model_bytes
from ...telemetry.model_flops import throughput_fields
from ...telemetry.steady_state import CompileRecord, peak_memory_per_rank, steady_fields
from ...telemetry.step_metrics import Tally, ends_interval
from ...weights.export import export_on_rank0
from . import timeline
from .pipedream import PipeDreamStage
from .run_state import PipeRun
from .schedules import StepOut
from .stage_times import split_idle
from .timeline import Token


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t



def average_over_data(params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average a stage's gradients (this rank's tensor-parallel shards) with the other replicas' same stage."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _allreduce_grads(run: PipeRun) -> float:
    """Average stage i's gradients over the data-parallel replicas; returns the seconds it took."""
    if run.dp_size == 1:
        return 0.0
    t0 = time.perf_counter()
    average_over_data(run.optimizer.param_groups[0]["params"], run.dp_group, run.dp_size)
    return time.perf_counter() - t0


def _train_step(run: PipeRun, x: torch.Tensor, y: torch.Tensor) -> tuple[StepOut, float, float]:
    """Returns the engine's result, data-parallel all-reduce seconds and optimizer seconds."""
    m = run.cfg.spec.parallelism.microbatches
    if isinstance(run.engine, PipeDreamStage):
        out = run.engine.step(list(x.chunk(m)), list(y.chunk(m)), m)  # updates inside, per micro-batch
        run.scheduler.step()
        return out, 0.0, 0.0
    run.optimizer.zero_grad(set_to_none=True)
    out = run.engine.step(x, y)
    ar = _allreduce_grads(run)
    t0 = time.perf_counter()
    run.optimizer.step()
    run.scheduler.step()
    return out, ar, time.perf_counter() - t0


def _grad_bytes(run: PipeRun) -> int:
    """Bytes of this stage's gradients averaged over the data-parallel replicas per step (0: one replica)."""
    if run.dp_size == 1:
        return 0
    return sum(_local(p).numel() * p.element_size() for p in run.optimizer.param_groups[0]["params"])


def run_to_end(run: PipeRun, amp: Amp, wall0: float) -> dict[str, Any]:
    """Train the rest of the steps and write the final checkpoint, which carries the summary;
    a finished run resumed has nothing left to train and returns its summary. When every rank
    stopped on request, checkpoints the step they stopped after and raises StopRequested."""
    if run.summary is not None and run.step >= run.cfg.spec.training.steps:
        return run.summary
    summary = loop(run, amp)
    if summary is None:
        if run.step % run.cfg.spec.checkpoint.interval_steps:  # else the loop saved this step already
            run.save_checkpoint()  # synchronous: written, fsynced and renamed when it returns
        if run.ctx.is_main:
            print(f"disttrain-trainer: stopped on request after step {run.step}; checkpoint of step {run.step} "
                  f"in {run.cfg.checkpoint_dir}", flush=True)  # fmt: skip
        raise stop_request.StopRequested(f"after step {run.step}")
    summary["wallS"] = time.perf_counter() - wall0
    # Rank 0's whole model holds every stage's final blocks (gathered for the evaluation in `loop`).
    summary["export"] = export_on_rank0(lambda: run.full.state_dict() if run.ctx.is_main else None,
                                        checkpoint_dir=run.cfg.checkpoint_dir, spec=run.cfg.spec, step=run.step,
                                        is_main=run.ctx.is_main)  # fmt: skip
    run.summary = summary
    run.save_checkpoint()
    return summary


@dataclass(frozen=True, kw_only=True)
class _Pending:
    """A step whose timeline waits for the log interval's exchange (timeline.py)."""

    t0: float  # host: the step began (data)
    t1: float  # host: data on the device
    work_s: float  # host: the step's work (on a GPU only its launch; the events replace it)
    after_s: float  # host: evaluation, checkpoint and bookkeeping after the work
    span: tuple[Token, Token] | None  # a GPU step's work as events
    opt_s: float
    ar_s: float
    samples: int
    out: StepOut


def loop(run: PipeRun, amp: Amp) -> dict[str, Any] | None:
    """Train to spec.training.steps and return the summary; None when every rank stopped on request.

    Each step's compute intervals wait on this rank until the end of its log interval, when the
    ranks exchange them in one tensor all-gather (timeline.py) and split every step's idle time;
    a SIGTERM to any rank stops all of them after the same step (process/stop_agreement.py: a
    non-blocking flag on a gloo group of its own). On a GPU the device is synchronised once per
    log interval, not per step."""
    spec, ctx = run.cfg.spec, run.ctx
    tr, pp = spec.training, spec.parallelism.pipeline
    grad_bytes = _grad_bytes(run)
    eval_result: tuple[str, float] | None = None
    last_loss = float("nan")
    clock = run.engine.recorder.clock
    compiled = CompileRecord(tr.compile_mode)  # compile time apart; recompilations after the warm-up
    stop = StopAgreement(grace_s=spec.run_policy.termination_grace_period_seconds)
    pending: list[_Pending] = []
    interval: Tally = Tally()
    if ctx.is_main and run.metrics.enabled:  # the export's share of the run's end (the ETA adds it)
        run.metrics.finish.export_bytes = model_bytes(run.full)
    start = time.perf_counter()
    try:
        with LoopGC() as loop_gc:
            stop.start(run.step)
            while run.step < tr.steps:
                if not pending:
                    clock.start_interval()  # the device is idle here: the interval's time reference
                t0 = time.perf_counter()
                xb, yb = next_batch(run.ds, run.sampler)
                x = torch.from_numpy(np.asarray(xb)).to(ctx.device)
                y = torch.from_numpy(np.asarray(yb)).to(ctx.device)
                t1 = time.perf_counter()
                w0 = clock.mark() if clock.cuda else None
                out, ar_s, opt_s = _train_step(run, x, y)
                span = (w0, clock.mark()) if clock.cuda else None
                t_work = time.perf_counter()
                run.step += 1
                if tr.eval_interval_steps and run.step % tr.eval_interval_steps == 0 and run.step < tr.steps:
                    eval_result = _evaluate(run, amp)
                if run.step % spec.checkpoint.interval_steps == 0 and run.step < tr.steps:  # the final one: run_to_end
                    run.save_checkpoint()
                stop_now = run.step < tr.steps and stop.should_stop(run.step)
                end = time.perf_counter()
                pending.append(_Pending(t0=t0, t1=t1, work_s=t_work - t1, after_s=end - t_work, span=span,
                                        opt_s=opt_s, ar_s=ar_s, samples=len(x), out=out))  # fmt: skip
                if stop_now or ends_interval(run.step, log_every=tr.log_interval_steps, steps=tr.steps):
                    last_loss = _close_interval(run, pending, interval, grad_bytes)
                    compiled.interval()
                    pending, interval = [], Tally()
                loop_gc.after_step(run.step)
                if stop_now:
                    return None
        stop.close()
    finally:
        compiled.close()
    train_s = time.perf_counter() - start
    eval_result = _evaluate(run, amp)
    stage_totals: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(stage_totals, (run.dp_rank + run.tp_rank, run.pp_rank, run.totals, dict(run.bubble),
                                          run.peak_bytes))  # fmt: skip
    per_stage = [  # replica 0, tensor index 0
        {"stage": s, "bubbleFraction": b["bubble"] / b["window"] if b["window"] else 0.0,
         "computeFraction": t.fraction(t.compute_s), "idleFraction": t.fraction(t.idle_s),
         "commFraction": t.fraction(t.exposed_s), "activationPeakBytes": peak}
        for d, s, t, b, peak in sorted(stage_totals, key=lambda e: (e[0], e[1])) if d == 0
    ]  # fmt: skip
    t = run.totals
    # camelCase like every mode: this dict becomes the job's status.result.
    summary: dict[str, Any] = {
        "steps": run.step, "finalLoss": last_loss, "resumedFromStep": run.resumed_from,
        "restartAttempt": run.cfg.restart_attempt, "worldSize": ctx.world_size, "mode": spec.mode,
        "layout": layout_for(spec, ctx.world_size).describe(),
        "device": ctx.device.type, "backend": ctx.backend, "precision": tr.precision, "trainS": train_s,
        "samplesPerS": t.samples * run.dp_size / t.step_s if t.step_s else 0.0,
        # Fractions of step time; communication is all exposed here (busy = exposed).
        **t.fractions(),
        "pipeline": {"schedule": spec.parallelism.schedule, "stages": pp, "dataDegree": run.dp_size,
                     "tensorDegree": spec.parallelism.tensor,
                     "microbatches": spec.parallelism.microbatches, "plan": run.plan.to_json(),
                     "perStage": per_stage},
    }  # fmt: skip
    summary.update(throughput_fields(spec, vocab=run.ds.num_classes, samples_per_s=summary["samplesPerS"],
                                     device=ctx.device, accelerators=ctx.world_size))  # fmt: skip
    summary.update(steady_fields(run.scaling.steady, compiled.steady_s, spec=spec, vocab=run.ds.num_classes,
                                 dp=run.dp_size, device=ctx.device, accelerators=ctx.world_size))  # fmt: skip
    summary.update(compiled.fields())
    peaks = peak_memory_per_rank(ctx.device, ctx.world_size)
    if peaks is not None:
        summary["peakMemoryBytesPerRank"] = peaks
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    summary["scaling"] = _scaling_block(run)
    return summary


def _close_interval(run: PipeRun, steps: list[_Pending], interval: Tally, grad_bytes: int) -> float:
    """The end of a log interval (collective): exchange the steps' timelines, split each step's
    time, publish the interval; returns the last step's loss (mean over the replicas)."""
    spec, ctx, clock = run.cfg.spec, run.ctx, run.engine.recorder.clock
    tr = spec.training
    cap = timeline.capacity(spec.parallelism.microbatches, len(getattr(run.engine, "stage_ids", [0])))
    if clock.cuda:
        torch.cuda.synchronize(ctx.device)  # the one wait per interval: every event has happened
    rows, own = [], []
    for p in steps:
        ivs = [(k, s, m, clock.resolve(a), clock.resolve(b)) for k, s, m, a, b in p.out.intervals]
        own.append(ivs)
        loss = None if p.out.loss is None else float(p.out.loss)
        rows.append(timeline.pack(run.dp_rank, run.tp_rank, loss, ivs, cap))
    everyone = timeline.exchange(rows, world_size=ctx.world_size, device=ctx.device)
    mine = (run.dp_rank, run.tp_rank)
    losses: list[float] = []
    times = None
    for p, ivs, ranks in zip(steps, own, everyone, strict=True):
        times = split_idle(ivs, [r.intervals for r in ranks if (r.dp_rank, r.tp_rank) == mine], run.plan.stages)
        step_losses = [r.loss for r in ranks if r.loss is not None and r.tp_rank == 0]  # one per replica
        losses.append(float(np.mean(step_losses)) if step_losses else float("nan"))
        # A GPU step's work is its events' span; a CPU step's the host's clock around it.
        work = clock.resolve(p.span[1]) - clock.resolve(p.span[0]) if p.span is not None else p.work_s
        compute = min(work, times.compute_s + p.opt_s)
        comm = min(work - compute, times.p2p_s + p.ar_s)
        t2 = p.t1 + compute + comm  # the rest of the step, up to `end`, is idle
        end = p.t1 + work + p.after_s
        run.metrics.observe_step_time(end - p.t0)
        interval.add_step(t0=p.t0, t1=p.t1, t2=t2, end=end, exposed_s=comm, busy_s=comm, idle_s=end - t2,
                          samples=p.samples)  # fmt: skip
        run.pmetrics.observe_step(times, p2p_s=times.p2p_s, allreduce_s=p.ar_s, act_peak_bytes=p.out.act_peak_bytes)
        run.peak_bytes = max(run.peak_bytes, p.out.act_peak_bytes)
        run.bubble["bubble"] += times.bubble_s
        run.bubble["window"] += times.window_s
    assert times is not None
    last = steps[-1]
    lr = run.scheduler.get_last_lr()[0]
    loss = float(np.mean(losses))
    mfu = throughput_fields(spec, vocab=run.ds.num_classes, device=ctx.device, accelerators=ctx.world_size,
                            samples_per_s=interval.record()["samples_per_s"] * run.dp_size).get("mfu")  # fmt: skip
    run.metrics.observe_interval(
        step=run.step, loss=loss, lr=lr, tally=interval, gradient_bytes=grad_bytes,
        extra={"stage": run.pp_rank, "p2p_s": times.p2p_s, "allreduce_s": last.ar_s, "bubble_s": times.bubble_s,
               "bubble_fraction": times.bubble_fraction, "window_s": times.window_s,
               "act_peak_bytes": last.out.act_peak_bytes},
        mfu=mfu, data_degree=run.dp_size,
    )  # fmt: skip
    if ctx.is_main:
        rec = interval.record()
        print(f"step {run.step}/{tr.steps} loss {loss:.4f} lr {lr:.4g} "
              f"samples/s {rec['samples_per_s'] * run.dp_size:.0f} bubble {times.bubble_fraction:.0%} "
              f"comm {rec['comm_exposed_fraction']:.0%}", flush=True)  # fmt: skip
    run.totals.merge(interval)
    run.scaling.interval(interval)
    return losses[-1]


def _scaling_block(run: PipeRun) -> dict[str, Any]:
    """The forecast's inputs (telemetry/scaling_record.py); gathers each stage's compute (collective)."""
    spec, ctx = run.cfg.spec, run.ctx
    stage_compute = scaling_record.gather_stage_compute(run.scaling, run.totals, replica=run.dp_rank + run.tp_rank,
                                                        stage=run.pp_rank, world_size=ctx.world_size,
                                                        stages=spec.parallelism.pipeline)  # fmt: skip
    host = scaling_record.host_facts(world_size=ctx.world_size, nproc_per_node=run.cfg.nproc_per_node,
                                     master_addr=run.cfg.master_addr)  # fmt: skip
    pipe = scaling_record.pipeline_facts(run.scaling.profiles, run.plan.bounds, stage_compute)
    return scaling_record.summary_block(run.scaling, totals=run.totals, model=run.full,
                                        batch=spec.data.batch_size // run.dp_size, precision=spec.training.precision,
                                        host=host, pipeline=pipe)  # fmt: skip


def _evaluate(run: PipeRun, amp: Amp) -> tuple[str, float] | None:
    """Rank 0 gathers every stage's blocks into its whole model and evaluates it."""
    t0 = time.perf_counter()
    state = run.gather_blocks()
    result = None
    if state is not None:
        load_block_state(run.full_blocks, range(len(run.full_blocks)), state)
        run.full.to(run.ctx.device)
        result = evaluate(run.full, run.ds, amp)
        run.metrics.observe_eval(run.step, *result, seconds=time.perf_counter() - t0)
    return result
