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
from ...run_common import SUMMARY_EVAL_KEY, evaluate
from ...telemetry import scaling_record
from ...telemetry.finish_estimate import model_bytes
from ...telemetry.model_flops import throughput_fields
from ...telemetry.step_metrics import Tally, ends_interval
from ...weights.export import export_on_rank0
from .pipedream import PipeDreamStage
from .run_state import PipeRun
from .schedules import StepOut
from .stage_times import split_idle


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


def loop(run: PipeRun, amp: Amp) -> dict[str, Any] | None:
    """Train to spec.training.steps and return the summary; None when every rank stopped on request.

    The stop flag rides in the all_gather_object every step makes anyway (a SIGTERM to any rank
    stops all of them after the same step, at no extra cost)."""
    spec, ctx = run.cfg.spec, run.ctx
    tr, pp = spec.training, spec.parallelism.pipeline
    n_stages = run.plan.stages
    grad_bytes = _grad_bytes(run)
    eval_result: tuple[str, float] | None = None
    last_loss = float("nan")
    interval, losses = Tally(), []
    if ctx.is_main and run.metrics.enabled:  # the export's share of the run's end (the ETA adds it)
        run.metrics.finish.export_bytes = model_bytes(run.full)
    start = time.perf_counter()
    with LoopGC() as loop_gc:
        while run.step < tr.steps:
            t0 = time.perf_counter()
            xb, yb = next_batch(run.ds, run.sampler)
            x = torch.from_numpy(np.asarray(xb)).to(ctx.device)
            y = torch.from_numpy(np.asarray(yb)).to(ctx.device)
            t1 = time.perf_counter()
            out, ar_s, opt_s = _train_step(run, x, y)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            work = time.perf_counter() - t1
            # Every rank's timeline and loss: the pipeline's ranks split their idle time with them.
            everyone: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(everyone, ((run.dp_rank, run.tp_rank), out.intervals, out.loss,
                                              stop_request.requested()))  # fmt: skip
            mine = (run.dp_rank, run.tp_rank)
            times = split_idle(out.intervals, [ivs for d, ivs, _, _ in everyone if d == mine], n_stages)
            step_losses = [ls for (_, t), _, ls, _ in everyone if ls is not None and t == 0]  # one per replica
            stop_now = any(asked for *_, asked in everyone)
            last_loss = float(np.mean(step_losses)) if step_losses else float("nan")
            losses.append(last_loss)
            run.step += 1
            stop_now = stop_now and run.step < tr.steps
            if tr.eval_interval_steps and run.step % tr.eval_interval_steps == 0 and run.step < tr.steps:
                eval_result = _evaluate(run, amp)
            if run.step % spec.checkpoint.interval_steps == 0 and run.step < tr.steps:  # the final one: run_to_end
                run.save_checkpoint()
            end = time.perf_counter()
            compute = min(work, times.compute_s + opt_s)
            comm = min(work - compute, times.p2p_s + ar_s)
            t2 = t1 + compute + comm  # the rest of the step, up to `end`, is idle
            run.metrics.observe_step_time(end - t0)
            interval.add_step(t0=t0, t1=t1, t2=t2, end=end, exposed_s=comm, busy_s=comm, idle_s=end - t2,
                              samples=len(x))  # fmt: skip
            run.pmetrics.observe_step(times, p2p_s=times.p2p_s, allreduce_s=ar_s, act_peak_bytes=out.act_peak_bytes)
            run.peak_bytes = max(run.peak_bytes, out.act_peak_bytes)
            run.bubble["bubble"] += times.bubble_s
            run.bubble["window"] += times.window_s
            if stop_now or ends_interval(run.step, log_every=tr.log_interval_steps, steps=tr.steps):
                lr = run.scheduler.get_last_lr()[0]
                loss = float(np.mean(losses))
                mfu = throughput_fields(spec, vocab=run.ds.num_classes, device=ctx.device, accelerators=ctx.world_size,
                                        samples_per_s=interval.record()["samples_per_s"] * run.dp_size).get("mfu")  # fmt: skip
                run.metrics.observe_interval(
                    step=run.step, loss=loss, lr=lr, tally=interval, gradient_bytes=grad_bytes,
                    extra={"stage": run.pp_rank, "p2p_s": times.p2p_s, "allreduce_s": ar_s, "bubble_s": times.bubble_s,
                           "bubble_fraction": times.bubble_fraction, "window_s": times.window_s,
                           "act_peak_bytes": out.act_peak_bytes},
                    mfu=mfu, data_degree=run.dp_size,
                )  # fmt: skip
                if ctx.is_main:
                    rec = interval.record()
                    print(f"step {run.step}/{tr.steps} loss {loss:.4f} lr {lr:.4g} "
                          f"samples/s {rec['samples_per_s'] * run.dp_size:.0f} bubble {times.bubble_fraction:.0%} "
                          f"comm {rec['comm_exposed_fraction']:.0%}", flush=True)  # fmt: skip
                run.totals.merge(interval)
                run.scaling.interval(interval)
                interval, losses = Tally(), []
            loop_gc.after_step(run.step)
            if stop_now:
                return None
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
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    summary["scaling"] = _scaling_block(run)
    return summary


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
