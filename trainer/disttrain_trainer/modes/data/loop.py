"""The training loop of data, tensor and hybrid without a pipeline: data -> forward/backward -> optimizer,
with metrics and checkpoints (a pipeline: modes/pipeline/).

Time per step is split four ways and measured, not estimated (see disttrain_api.metric_names):
  data          = fetching this rank's rows from the shards and moving them to the device;
  comm exposed  = the step waiting on communication nothing overlapped (DDP's reducer timer, read
                  on a sample of steps: `measures_comm`; for a sharded model, the profiler's
                  collective events: parallel/comm_profile.py);
  compute       = the forward/backward/optimizer window minus the exposed communication;
  idle          = waiting while rank 0 evaluates or snapshots a checkpoint alone (timed up to a barrier).
Busy communication (a collective in flight, overlapped or not) is reported beside them.
With training.sync localsgd / diloco the steps do not communicate; every interval-th step ends
with the sync of the parameters (parallel/sync.py), its time exposed communication of that step.
The loop keeps the device unsynchronised: the loss stays a tensor until a log interval.

A sharded model (tensor parallel, FSDP: DTensor parameters) needs every rank in each forward, so
every rank evaluates it, and its checkpoints are DCP ones that every rank writes its shards of
(checkpoints/sharded.py); either format resumes into either kind of model.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel

from ...data import Dataset, next_batch
from ...parallel import ddp, hybrid
from ...parallel.block_compile import compile_loss, loss_mode
from ...parallel.comm_profile import ProfiledComm
from ...parallel.ddp import CommClock, CommTimes
from ...parallel.mesh import Layout
from ...process import stop_request
from ...process.loop_gc import LoopGC
from ...process.precision import Amp
from ...run_common import SUMMARY_EVAL_KEY, Summary, evaluate, loss_fn_for, probe_eval_seconds
from ...telemetry import scaling_record
from ...telemetry.finish_estimate import model_bytes, probe_due
from ...telemetry.model_flops import throughput_fields
from ...telemetry.steady_state import CompileRecord, peak_memory_per_rank, steady_fields
from ...telemetry.step_metrics import StepRecord, Tally, ends_interval, fold_steps
from . import layouts
from .run_state import Run

# On a CPU, the steps whose communication is read from DDP's timer (besides each log interval's last).
CPU_COMM_SAMPLE_EVERY = 10


def _batch(run: Run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = next_batch(run.ds, run.sampler)
    dev = run.ctx.device
    xt, yt = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y))
    if dev.type != "cpu":  # from pinned memory the copy is queued and the host goes on
        xt, yt = xt.pin_memory().to(dev, non_blocking=True), yt.pin_memory().to(dev, non_blocking=True)
    k = run.cfg.spec.training.grad_accumulation
    return [(xt, yt)] if k == 1 else list(zip(xt.chunk(k), yt.chunk(k), strict=True))


def _replica_divergence(model: nn.Module) -> float:
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return float((hi - lo).max())


def _between_steps(run: Run, *, evaluate_now: bool, checkpoint_now: bool) -> tuple[str, float] | None:
    """Evaluation and the checkpoint snapshot: rank 0 works alone, the others wait at the barrier
    (a sharded model is evaluated and saved by every rank together)."""
    result = _evaluate_run(run) if evaluate_now else None
    if checkpoint_now:
        run.save_checkpoint()
    dist.barrier()  # the wait ends here, as idle time, not inside the next step's all-reduce
    return result


def evaluate_model(model: nn.Module, ds: Dataset, amp: Amp, rows: tuple[int, int] | None = None) -> tuple[str, float]:
    """run_common.evaluate under loss_parallel: a tensor-parallel model's vocabulary-sharded logits
    meet a vocabulary-parallel cross-entropy (a no-op for plain tensors)."""
    with loss_parallel():
        return evaluate(model, ds, amp, rows=rows)


def _evaluate_run(run: Run) -> tuple[str, float] | None:
    """Evaluate on rank 0, or on every rank for a sharded model; rank 0 records it and returns it."""
    if not (run.ctx.is_main or run.sharded):
        return None
    t0 = time.perf_counter()
    result = evaluate_model(run.inner, run.ds, run.amp)
    if not run.ctx.is_main:
        return None
    run.metrics.observe_eval(run.step, *result, seconds=time.perf_counter() - t0)
    return result


def measures_comm(step: int, *, log_every: int, steps: int, cuda: bool) -> bool:
    """Whether the loop reads DDP's communication timer on `step` (see `train`): the last step of
    each log interval, and on a CPU also every CPU_COMM_SAMPLE_EVERY-th step."""
    return ends_interval(step, log_every=log_every, steps=steps) or (not cuda and step % CPU_COMM_SAMPLE_EVERY == 0)


def train(run: Run) -> Summary | None:
    """Train to spec.training.steps and return the summary; None when every rank stopped on
    request (run.stop) after run.step."""
    spec, ctx, metrics = run.cfg.spec, run.ctx, run.metrics
    tr = spec.training
    comm = run.comm if metrics.enabled else None
    # localsgd / diloco: the model is DDP only for the every-step steps (sync.everyStepFirst), whose
    # per-step all-reduce the census must not count as the run's.
    step_fn = run.scaling.with_census(layouts.train_step_for(run.model, comm),
                                      run.model if run.outer is None else run.inner)  # fmt: skip
    layout = layouts.layout(run.cfg)
    loss_fn = compile_loss(loss_fn_for(run.ds), loss_mode(tr.compile_mode, tensor_parallel=layout.tp > 1))
    compiled = CompileRecord(tr.compile_mode)  # compile time apart; recompilations after the warm-up
    cuda = ctx.device.type == "cuda"
    dp = layout.dp  # ranks of one tensor-parallel group share their samples
    if run.sharded:
        grad_bytes = hybrid.data_gradient_bytes(run.inner, layout)
    elif run.outer is not None:  # localsgd / diloco: per log interval (_sync_bytes_per_step)
        grad_bytes = 0
    else:
        grad_bytes = ddp.gradient_bytes(run.inner)
    ckpt_every, eval_every, log_every = spec.checkpoint.interval_steps, tr.eval_interval_steps, tr.log_interval_steps
    no_comm = CommTimes(busy_s=0.0, exposed_s=0.0)
    interval = Tally()
    steps: list[StepRecord] = []  # this interval's steps, folded into `interval` at its end
    record = steps.append
    losses: list[torch.Tensor] = []  # this interval's losses, on the device until the log
    last_loss: torch.Tensor | None = None
    eval_result: tuple[str, float] | None = None
    # On a GPU the loop waits for the device only where a figure needs it: the last step of
    # each log interval (its communication is measured: DDP's CUDA timer reads events), the
    # step before it (so the measured step starts with an idle queue), and a step followed by
    # evaluation or a checkpoint. In between, the host runs ahead and the GPU never starves;
    # those steps' work is split like the measured steps' (Tally.settle). On a CPU the loop
    # reads DDP's timer on every CPU_COMM_SAMPLE_EVERY-th step and the last of each interval:
    # a timed step and its read cost 40-65 us of host time, 2-5% of a small model's step.
    sampled = isinstance(comm, CommClock)

    def last_of_interval(step: int) -> bool:
        return ends_interval(step, log_every=log_every, steps=tr.steps)

    # What the run will cost after its last step (the ETA adds it): rank 0 probes the evaluation (a
    # sharded model is evaluated by every rank together: only a real evaluation is timed there).
    probe = ctx.is_main and metrics.enabled and not run.sharded
    if ctx.is_main and metrics.enabled:
        metrics.finish.export_bytes = model_bytes(run.inner)
    if probe:
        metrics.finish.observe_probe(probe_eval_seconds(run.inner, run.ds, run.amp, evaluate_model))
    intervals = 0
    stop = run.stop
    stopped = False
    start = time.perf_counter()
    try:
        with LoopGC() as loop_gc:
            if stop is not None:
                stop.start(run.step)
            while run.step < tr.steps:
                step = run.step + 1
                evaluate_now = bool(eval_every) and step % eval_every == 0 and step < tr.steps
                checkpoint_now = step % ckpt_every == 0 and step < tr.steps  # the final one: `run`, with the summary
                measured = not sampled or measures_comm(step, log_every=log_every, steps=tr.steps, cuda=cuda)
                if sampled:
                    comm.measure_next(measured)  # type: ignore[union-attr]
                t0 = time.perf_counter()
                micro = _batch(run)
                t1 = time.perf_counter()
                res = step_fn(run.model, micro, loss_fn=loss_fn, optimizer=run.optimizer,
                              scheduler=run.scheduler, amp=run.amp)  # fmt: skip
                if cuda and (measured or last_of_interval(step + 1) or evaluate_now or checkpoint_now):
                    torch.cuda.synchronize(ctx.device)
                c = no_comm if comm is None else comm.take() if measured else None
                exposed, busy = (c.exposed_s, c.busy_s) if c is not None else (None, None)
                if run.outer is not None and run.outer.due(step):  # localsgd / diloco: this step ends with a sync
                    sync_s = run.outer.sync().comm.exposed_s
                    exposed, busy = (exposed or 0.0) + sync_s, (busy or 0.0) + sync_s
                elif run.outer is not None and step == tr.sync.every_step_first:  # the replicas step apart now
                    _step_apart(run)
                    comm, sampled = None, False
                run.step = step
                last_loss = res.loss
                losses.append(res.loss)
                idle = 0.0
                if evaluate_now or checkpoint_now:
                    ti = time.perf_counter()
                    eval_result = _between_steps(run, evaluate_now=evaluate_now, checkpoint_now=checkpoint_now) or eval_result
                    idle = time.perf_counter() - ti
                end = time.perf_counter()
                # The work span ends where the idle span begins: the step's own bookkeeping (the
                # communication figures, the loss) is its compute, so data + work + idle is the
                # step's wall time exactly, also when the OS preempts the rank between two clocks.
                # A CPU step's wall time is its own, measured or not; a GPU step's only when it waited.
                record((t0, t1, end - idle, end, exposed, busy, idle, res.samples, measured or not cuda))
                if last_of_interval(run.step):
                    fold_steps(steps, interval, metrics)
                    _log_interval(run, interval, losses, _sync_bytes_per_step(run, interval, grad_bytes), dp)
                    run.totals.merge(interval)
                    if run.outer is None or run.step - interval.steps >= tr.sync.every_step_first:
                        run.scaling.interval(interval)  # (the forecast models the steps apart, not the DDP ones)
                    compiled.interval()
                    if ctx.is_main and run.scaling.steady.steps and metrics.forecast_due():
                        run.metrics.observe_forecast(_forecast_inputs(run, layout, interval))
                    interval, losses = Tally(), []
                    intervals += 1
                    if probe and not metrics.finish.eval_timed and probe_due(intervals) and run.step < tr.steps:
                        metrics.finish.observe_probe(probe_eval_seconds(run.inner, run.ds, run.amp, evaluate_model))
                loop_gc.after_step(run.step)
                if stop is not None and run.step < tr.steps and stop.should_stop(run.step):
                    stopped = True
                    break
        train_s = time.perf_counter() - start
    finally:
        compiled.close()
        run.report_checkpoints(wait=True)  # the last write finishes before the trainer exits
    if stopped:
        if steps:  # the interval cut short: its figures and its progress line, like a full one
            fold_steps(steps, interval, metrics)
            _log_interval(run, interval, losses, _sync_bytes_per_step(run, interval, grad_bytes), dp)
        return None
    if stop is not None:
        stop.close()
    if run.outer is not None and not run.outer.due(run.step):
        run.outer.sync()  # the replicas end on one model (the final checkpoint and export hold it)
    loss_t = torch.tensor([float(last_loss) if last_loss is not None else float("nan")],
                          dtype=torch.float64, device=ctx.device)  # fmt: skip
    dist.all_reduce(loss_t)  # the mean over ranks = the loss of the global batch
    # Sharded parameters differ between ranks by design; replicas are compared in ddp only.
    divergence = None if run.sharded else _replica_divergence(run.model)
    eval_result = _evaluate_run(run)
    t = run.totals
    # camelCase like the rest of the API: this dict becomes the job's status.result.
    summary: dict[str, Any] = {
        "steps": run.step,
        "finalLoss": float(loss_t) / ctx.world_size,
        "resumedFromStep": run.resumed_from,
        "restartAttempt": run.cfg.restart_attempt,
        "worldSize": ctx.world_size,
        "mode": spec.mode,
        "layout": layout.describe(),
        "dataStrategy": spec.parallelism.data_strategy,
        "device": ctx.device.type,
        "backend": ctx.backend,
        "precision": tr.precision,
        "trainS": train_s,
        "samplesPerS": t.samples * dp / t.step_s if t.step_s else 0.0,
        # Fractions of step time; busy overlaps compute, the other three add up with compute.
        **t.fractions(),
        "replicaMaxAbsDiff": divergence,
        # Every step's gradients, or (localsgd / diloco) one copy of the parameters per sync and per
        # every-step step (sync.everyStepFirst).
        "sync": tr.sync.kind,
        "syncEvery": tr.sync.every,
        "everyStepFirst": tr.sync.every_step_first,
        "commBytes": ((run.outer.syncs + tr.sync.every_step_first) * run.outer.bytes_per_sync if run.outer is not None
                      else grad_bytes * (run.step - (run.resumed_from or 0)) if dp > 1 else 0),
    }
    summary.update(throughput_fields(spec, vocab=run.ds.num_classes, samples_per_s=summary["samplesPerS"],
                                     device=ctx.device, accelerators=ctx.world_size))  # fmt: skip
    # Beside the whole-run mean: the steady state (compile time out), compile time, peak memory per rank.
    summary.update(steady_fields(run.scaling.steady, compiled.steady_s, spec=spec, vocab=run.ds.num_classes, dp=dp,
                                 device=ctx.device, accelerators=ctx.world_size))  # fmt: skip
    summary.update(compiled.fields())
    peaks = peak_memory_per_rank(ctx.device, ctx.world_size)
    if peaks is not None:
        summary["peakMemoryBytesPerRank"] = peaks
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    summary["scaling"] = _scaling_block(run, layout)
    return summary


def _forecast_inputs(run: Run, layout: Layout, interval: Tally) -> dict[str, Any]:
    """What a summary gives the forecast, as measured so far (steady state: the first interval
    left out), for the operator's hint on the running job and the forecast gauges."""
    spec, ctx = run.cfg.spec, run.ctx
    return {"mode": spec.mode, "worldSize": ctx.world_size, "layout": layout.describe(),
            "dataStrategy": spec.parallelism.data_strategy, "device": ctx.device.type, "backend": ctx.backend,
            "commExposedFraction": interval.record()["comm_exposed_fraction"],
            "scaling": _scaling_block(run, layout)}  # fmt: skip


def _scaling_block(run: Run, layout: Layout) -> dict[str, Any]:
    """The forecast's inputs (telemetry/scaling_record.py): DDP's census and buckets, or the mesh's census."""
    spec, ctx = run.cfg.spec, run.ctx
    tr = spec.training
    mesh_kinds = run.comm.kinds if isinstance(run.comm, ProfiledComm) else None
    ddp_facts = scaling_record.ddp_facts(run.model, run.scaling, compression=tr.gradient_compression,
                                         rank=tr.powersgd_rank)  # fmt: skip
    host = scaling_record.host_facts(world_size=ctx.world_size, nproc_per_node=run.cfg.nproc_per_node,
                                     master_addr=run.cfg.master_addr)  # fmt: skip
    return scaling_record.summary_block(run.scaling, totals=run.totals, model=run.inner,
                                        batch=spec.data.batch_size // layout.dp, precision=tr.precision, host=host,
                                        ddp=ddp_facts, kinds=mesh_kinds, pure_tensor=layout.dp == 1 and layout.tp > 1)  # fmt: skip


def checkpoint_on_stop(run: Run) -> NoReturn:
    """Every rank stopped after run.step: save that step unless it is saved already, wait until
    the write is durable (fsynced and renamed), then leave with StopRequested."""
    if run.saved_step != run.step:
        run.save_checkpoint()
    run.report_checkpoints(wait=True)
    if run.ctx.is_main:
        print(f"disttrain-trainer: stopped on request after step {run.step}; checkpoint of step {run.step} "
              f"in {run.cfg.checkpoint_dir}", flush=True)  # fmt: skip
    raise stop_request.StopRequested(f"after step {run.step}")


def _step_apart(run: Run) -> None:
    """The end of sync.everyStepFirst: the replicas go on from the model DDP left on each of them as
    plain modules, synchronised every interval steps. A backward of the module outside DDP's forward
    all-reduces nothing (DDP's hooks act only after its own forward: tests/dist/test_sync_trainer.py);
    from here on a step's communication is its sync's (timed by the sync, no clock)."""
    assert run.outer is not None
    run.model = run.inner
    run.comm = None
    run.outer.step_apart()


def _sync_bytes_per_step(run: Run, interval: Tally, grad_bytes: int) -> int:
    """The bytes all-reduced per step of the interval that ends at run.step: `grad_bytes` (every step's
    gradients) unless localsgd / diloco, whose every-step steps and syncs are one model's size each."""
    if run.outer is None or not interval.steps:
        return grad_bytes
    moved = run.outer.spec.all_reduces(run.step - interval.steps + 1, run.step) * run.outer.bytes_per_sync
    return round(moved / interval.steps)


def _log_interval(run: Run, interval: Tally, losses: list[torch.Tensor], grad_bytes: int, dp: int) -> None:
    """Once per log interval: the one host sync for the loss, the metrics, the progress line."""
    loss = float(torch.stack(losses).mean()) if losses else float("nan")
    lr = run.scheduler.get_last_lr()[0]
    extra = None
    if isinstance(run.comm, ProfiledComm):  # every collective's payload, tensor-parallel ones too
        extra = {"comm_bytes": run.comm.taken.bytes}
    ctx, spec = run.ctx, run.cfg.spec
    job_samples_per_s = interval.record()["samples_per_s"] * dp
    mfu = throughput_fields(spec, vocab=run.ds.num_classes, samples_per_s=job_samples_per_s, device=ctx.device,
                            accelerators=ctx.world_size).get("mfu")  # fmt: skip
    run.metrics.observe_interval(step=run.step, loss=loss, lr=lr, tally=interval, gradient_bytes=grad_bytes,
                                 extra=extra, mfu=mfu, data_degree=dp)  # fmt: skip
    run.report_checkpoints()
    if run.ctx.is_main:
        rec = interval.record()
        print(f"step {run.step}/{run.cfg.spec.training.steps} loss {loss:.4f} lr {lr:.4g} "
              f"samples/s {rec['samples_per_s'] * dp:.0f} "
              f"comm exposed {rec['comm_exposed_fraction']:.0%} busy {rec['comm_busy_fraction']:.0%}", flush=True)  # fmt: skip


