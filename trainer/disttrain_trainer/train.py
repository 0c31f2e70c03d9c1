"""The training loop of data, tensor and hybrid without a pipeline: data -> forward/backward -> optimizer,
with metrics and checkpoints (pipeline layouts: pipeline_train.py).

Time per step is split four ways and measured, not estimated (see disttrain_api.metric_names):
  data          = fetching this rank's rows from the shards and moving them to the device;
  comm exposed  = the step waiting on communication nothing overlapped (DDP's reducer timer, read
                  on a sample of steps: `measures_comm`; for a sharded model, the profiler's
                  collective events: parallel/comm_profile.py);
  compute       = the forward/backward/optimizer window minus the exposed communication;
  idle          = waiting while rank 0 evaluates or snapshots a checkpoint alone (timed up to a barrier).
Busy communication (a collective in flight, overlapped or not) is reported beside them.
The loop keeps the device unsynchronised: the loss stays a tensor until a log interval.

A sharded model (tensor parallel, FSDP: DTensor parameters) needs every rank in each forward, so
every rank evaluates it, and its checkpoints are DCP ones that every rank writes its shards of
(sharded_checkpoint.py); either format resumes into either kind of model.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel

from . import checkpoint as ckpt
from . import parallel, resume, scaling_record
from . import sharded_checkpoint as sharded_ckpt
from .config import SUMMARY_FILE, ConfigError, TrainerConfig, finished_path
from .data import Dataset, GlobalBatchSampler, load_dataset
from .dist_env import DistContext, cleanup, finish, init_distributed, keep_until_exit
from .loop_gc import LoopGC
from .metrics import Metrics, StepRecord, Tally, ends_interval, fold_steps
from .model_flops import throughput_fields
from .models import build_model, resolve
from .optim import build_optimizer, build_scheduler
from .precision import Amp, make_amp

EVAL_BATCH = 512
# On a CPU, the steps whose communication is read from DDP's timer (besides each log interval's last).
CPU_COMM_SAMPLE_EVERY = 10
# evaluate() names its figure like the metrics log does; the summary speaks the API's camelCase.
SUMMARY_EVAL_KEY = {"test_accuracy": "testAccuracy", "val_loss": "valLoss"}


def check_supported(cfg: TrainerConfig) -> None:
    """Fail fast, before any process group exists, on what this trainer cannot run."""
    spec = cfg.spec
    if spec.mode not in parallel.IMPLEMENTED:
        raise parallel.ModeNotImplemented(spec.mode)
    if parallel.runs_pipeline(spec):
        from .pipeline_train import check_pipeline_supported  # noqa: PLC0415 - it imports this module

        check_pipeline_supported(cfg)
        return
    dp = parallel.data_shard(cfg, 0)[1]  # also checks that the degrees fit this world size
    parts = dp * spec.training.grad_accumulation
    if spec.data.batch_size % parts:
        raise ConfigError(
            f"data.batchSize {spec.data.batch_size} must be divisible by data-parallel degree {dp} x "
            f"training.gradAccumulation {spec.training.grad_accumulation} = {parts}"
        )
    resolve(spec.model.name)  # a `module:factory` that does not import fails before any rendezvous


def _set_threads(cfg: TrainerConfig) -> None:
    if os.environ.get("OMP_NUM_THREADS"):
        return
    local = cfg.master_addr in ("127.0.0.1", "localhost", "::1")
    share = cfg.world_size if local else cfg.nproc_per_node
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, share)))


def loss_fn_for(ds: Dataset):  # noqa: ANN201
    if ds.kind == "lm":
        return lambda logits, y: F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]), y.reshape(-1)
        )
    return lambda logits, y: F.cross_entropy(logits.float(), y)


@torch.no_grad()
def evaluate(model: nn.Module, ds: Dataset, amp: Amp) -> tuple[str, float]:
    """Test accuracy (classification) or validation loss (text) of the full held-out set.

    A sharded model needs every rank here; its vocabulary-sharded logits go through
    loss_parallel's cross-entropy (a no-op for plain tensors)."""
    with loss_parallel():
        return _evaluate(model, ds, amp)


def _evaluate(model: nn.Module, ds: Dataset, amp: Amp) -> tuple[str, float]:
    was_training = model.training
    model.eval()
    x_all, y_all = ds.test_batches()
    correct, loss_sum, count = 0, 0.0, 0
    for i in range(0, len(x_all), EVAL_BATCH):
        x = torch.from_numpy(np.asarray(x_all[i : i + EVAL_BATCH])).to(amp.device)
        y = torch.from_numpy(np.asarray(y_all[i : i + EVAL_BATCH])).to(amp.device)
        with amp.autocast():
            logits = model(x).float()
        if ds.kind == "lm":
            loss_sum += float(
                F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
            )
            count += y.numel()
        else:
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
    model.train(was_training)
    return ("val_loss", loss_sum / count) if ds.kind == "lm" else ("test_accuracy", correct / count)


@dataclass(kw_only=True)
class Run:
    cfg: TrainerConfig
    ctx: DistContext
    ds: Dataset
    model: nn.Module  # the wrapped model (DDP, or the sharded module itself)
    inner: nn.Module  # the module whose state checkpoints hold (sharded in place on a mesh)
    comm: parallel.CommClock | parallel.ProfiledComm | None  # None: nothing to time (or metrics off)
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
    saver: ckpt.AsyncSaver | None = None  # rank 0's background checkpoint writer
    _gather: resume.PendingGather | None = None  # the last checkpoint's per-rank parts, possibly in flight
    scaling: scaling_record.ScalingRecorder = field(default_factory=scaling_record.ScalingRecorder)

    @property
    def sharded(self) -> bool:
        return parallel.is_sharded(self.inner)

    def state(self) -> dict[str, Any]:
        """Everything a resume needs; a sharded model's model and optimizer go to DCP instead."""
        return {**self._own_state(), **self._rank_parts(resume.gather_now(self._rank_part(), self.ctx.world_size))}

    def _own_state(self) -> dict[str, Any]:
        """The state without the per-rank parts (RNG streams, comm-hook state)."""
        weights = {} if self.sharded else {"model": self.inner.state_dict(), "optimizer": self.optimizer.state_dict()}
        return {
            "step": self.step,
            "world_size": self.ctx.world_size,
            "layout": parallel.layout(self.cfg).describe(),
            **weights,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.amp.scaler.state_dict() if self.amp.scaler is not None else None,
            "sampler": self.sampler.state_dict(),
            "summary": self.summary,
            "spec_data": {
                "batch_size": self.cfg.spec.data.batch_size,
                "seed": self.cfg.spec.data.seed,
            },
        }

    def _rank_part(self) -> tuple[Any, Any]:
        """This rank's RNG streams (dropout) and comm hook error feedback (PowerSGD)."""
        return resume.rng_state(), resume.hook_state(self.comm_hook_state)

    @staticmethod
    def _rank_parts(gathered: resume.PendingGather) -> dict[str, Any]:
        per_rank = gathered.result()
        return {"rng": [r for r, _ in per_rank], "comm_hook": [h for _, h in per_rank]}

    def restore(self, state: dict[str, Any]) -> None:
        """`state` without model and optimizer: sharded_checkpoint has restored those."""
        if "model" in state:
            self.inner.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = self.resumed_from = int(state["step"])
        self.summary = state.get("summary")
        layout = parallel.layout(self.cfg).describe()
        # Checkpoints without a layout were written by data parallel over their whole world.
        saved_layout = state.get("layout", f"dp={len(state['rng'])},pp=1,tp=1")
        if len(state["rng"]) == self.ctx.world_size and saved_layout == layout:
            # Same gang shape: each rank continues its own streams.
            resume.set_rng_state(state["rng"][self.ctx.rank])
            hooks = state.get("comm_hook") or [None] * self.ctx.world_size
            resume.load_hook_state(self.comm_hook_state, hooks[self.ctx.rank], self.ctx.device)
        else:  # resharded: no saved stream belongs to this rank; error feedback starts empty
            resume.seed_rank(self.cfg.spec.data.seed, self.step, parallel.rng_stream(self.cfg, self.ctx.rank))

    @property
    def comm_hook_state(self) -> Any:
        return getattr(self.model, "comm_hook_state", None)

    def save_checkpoint(self) -> None:
        """Snapshot the state; rank 0 hands it to the background writer (at most one write in flight).

        Every rank launches the gather of its RNG streams (resume.gather_async) and goes on; rank 0
        copies the state while that collective runs, and its writer thread waits for it. The caller
        times this and the barrier after it as idle time, not as communication.
        A sharded model's checkpoint is written by every rank, synchronously (DCP)."""
        if self.sharded:
            state = self.state()
            res = sharded_ckpt.save(self.cfg.checkpoint_dir, self.step, model=self.inner, optimizer=self.optimizer,
                                    extra=state, keep=self.cfg.spec.checkpoint.keep,
                                    layout=parallel.layout(self.cfg).describe())  # fmt: skip
            self.metrics.observe_checkpoint(self.step, res.seconds, res.bytes)
            return
        self.finish_gather()  # the previous checkpoint's gather: at most one in flight
        part = self._rank_part()
        # PowerSGD's error feedback is model-sized: gathered synchronously; RNG streams alone fit a slot.
        ws = self.ctx.world_size
        pending = resume.gather_now(part, ws) if part[1] is not None else resume.gather_async(part, ws, self.ctx.device)
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


def _resume(run: Run) -> None:
    """The newest checkpoint of either format into this run's model, whatever layout wrote it."""
    root = run.cfg.checkpoint_dir
    loaded = resume.agree_on_checkpoint(root, run.ctx, sharded=True)
    if loaded is None:
        return
    saved = loaded[1]
    if isinstance(saved, Path):  # DCP: every rank reads the byte ranges its own shards need
        state = sharded_ckpt.load(saved, model=run.inner, optimizer=run.optimizer)
    elif run.sharded:  # every rank holds the full tensors; each keeps its own shard of them
        state = sharded_ckpt.load_full(saved, model=run.inner, optimizer=run.optimizer)
    else:
        state = saved
        hooks = state.get("comm_hook") or []
        if len(hooks) == run.ctx.world_size and any(h is not None for h in hooks):
            _settle_buckets(run)
    run.restore(state)
    if run.ctx.is_main:
        print(f"disttrain-trainer: resumed from step {run.step} ({root})", flush=True)


def _batch(run: Run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = run.ds.batch(run.sampler.next_indices())
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


def _evaluate_run(run: Run) -> tuple[str, float] | None:
    """Evaluate on rank 0, or on every rank for a sharded model; rank 0 records it and returns it."""
    if not (run.ctx.is_main or run.sharded):
        return None
    result = evaluate(run.inner, run.ds, run.amp)
    if not run.ctx.is_main:
        return None
    run.metrics.observe_eval(run.step, *result)
    return result


def measures_comm(step: int, *, log_every: int, steps: int, cuda: bool) -> bool:
    """Whether the loop reads DDP's communication timer on `step` (see `_loop`): the last step of
    each log interval, and on a CPU also every CPU_COMM_SAMPLE_EVERY-th step."""
    return ends_interval(step, log_every=log_every, steps=steps) or (not cuda and step % CPU_COMM_SAMPLE_EVERY == 0)


def _loop(run: Run) -> dict[str, Any]:
    spec, ctx, metrics = run.cfg.spec, run.ctx, run.metrics
    tr = spec.training
    comm = run.comm if metrics.enabled else None
    step_fn = run.scaling.with_census(parallel.train_step_for(run.model, comm), run.model)
    loss_fn = loss_fn_for(run.ds)
    cuda = ctx.device.type == "cuda"
    layout = parallel.layout(run.cfg)
    dp = layout.dp  # ranks of one tensor-parallel group share their samples
    if run.sharded:
        grad_bytes = parallel.hybrid.data_gradient_bytes(run.inner, layout)
    else:
        grad_bytes = parallel.data.gradient_bytes(run.inner)
    ckpt_every, eval_every, log_every = spec.checkpoint.interval_steps, tr.eval_interval_steps, tr.log_interval_steps
    no_comm = parallel.CommTimes(busy_s=0.0, exposed_s=0.0)
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
    sampled = isinstance(comm, parallel.CommClock)

    def last_of_interval(step: int) -> bool:
        return ends_interval(step, log_every=log_every, steps=tr.steps)

    start = time.perf_counter()
    try:
        with LoopGC() as loop_gc:
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
                t2 = time.perf_counter()
                c = no_comm if comm is None else comm.take() if measured else None
                exposed, busy = (c.exposed_s, c.busy_s) if c is not None else (None, None)
                run.step = step
                last_loss = res.loss
                losses.append(res.loss)
                idle = 0.0
                if evaluate_now or checkpoint_now:
                    ti = time.perf_counter()
                    eval_result = _between_steps(run, evaluate_now=evaluate_now, checkpoint_now=checkpoint_now) or eval_result
                    idle = time.perf_counter() - ti
                end = time.perf_counter()
                # A CPU step's wall time is its own, measured or not; a GPU step's only when it waited.
                record((t0, t1, t2, end, exposed, busy, idle, res.samples, measured or not cuda))
                if last_of_interval(run.step):
                    fold_steps(steps, interval, metrics)
                    _log_interval(run, interval, losses, grad_bytes, dp)
                    run.totals.merge(interval)
                    run.scaling.interval(interval)
                    interval, losses = Tally(), []
                loop_gc.after_step(run.step)
        train_s = time.perf_counter() - start
    finally:
        run.report_checkpoints(wait=True)  # the last write finishes before the trainer exits
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
        "commExposedFraction": t.fraction(t.exposed_s),
        "commFraction": t.fraction(t.exposed_s),  # = exposed: what status.commFraction shows
        "commBusyFraction": t.fraction(t.busy_s),
        "idleFraction": t.fraction(t.idle_s),
        "dataFraction": t.fraction(t.data_s),
        "computeFraction": t.fraction(t.compute_s),
        "replicaMaxAbsDiff": divergence,
    }
    summary.update(throughput_fields(spec, vocab=run.ds.num_classes, samples_per_s=summary["samplesPerS"],
                                     device=ctx.device, accelerators=ctx.world_size))  # fmt: skip
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    summary["scaling"] = _scaling_block(run, layout)
    return summary


def _scaling_block(run: Run, layout: parallel.Layout) -> dict[str, Any]:
    """The forecast's inputs (scaling_record.py): DDP's census and buckets, or the mesh's census."""
    spec, ctx = run.cfg.spec, run.ctx
    tr = spec.training
    mesh_kinds = run.comm.kinds if isinstance(run.comm, parallel.ProfiledComm) else None
    ddp = scaling_record.ddp_facts(run.model, run.scaling, compression=tr.gradient_compression, rank=tr.powersgd_rank)
    host = scaling_record.host_facts(world_size=ctx.world_size, nproc_per_node=run.cfg.nproc_per_node,
                                     master_addr=run.cfg.master_addr)  # fmt: skip
    return scaling_record.summary_block(run.scaling, totals=run.totals, model=run.inner,
                                        batch=spec.data.batch_size // layout.dp, precision=tr.precision, host=host,
                                        ddp=ddp, kinds=mesh_kinds, pure_tensor=layout.dp == 1 and layout.tp > 1)  # fmt: skip


def _log_interval(run: Run, interval: Tally, losses: list[torch.Tensor], grad_bytes: int, dp: int) -> None:
    """Once per log interval: the one host sync for the loss, the metrics, the progress line."""
    loss = float(torch.stack(losses).mean()) if losses else float("nan")
    lr = run.scheduler.get_last_lr()[0]
    extra = None
    if isinstance(run.comm, parallel.ProfiledComm):  # every collective's payload, tensor-parallel ones too
        extra = {"comm_bytes": run.comm.taken.bytes}
    run.metrics.observe_interval(step=run.step, loss=loss, lr=lr, tally=interval, gradient_bytes=grad_bytes,
                                 extra=extra)  # fmt: skip
    run.report_checkpoints()
    if run.ctx.is_main:
        rec = interval.record()
        print(f"step {run.step}/{run.cfg.spec.training.steps} loss {loss:.4f} lr {lr:.4g} "
              f"samples/s {rec['samples_per_s'] * dp:.0f} "
              f"comm exposed {rec['comm_exposed_fraction']:.0%} busy {rec['comm_busy_fraction']:.0%}", flush=True)  # fmt: skip


def run(cfg: TrainerConfig, *, metrics: Metrics | None = None) -> dict[str, Any]:
    """Train one rank to completion; returns the summary (rank 0 also writes summary.json)."""
    wall0 = time.perf_counter()
    check_supported(cfg)
    _set_threads(cfg)
    spec = cfg.spec
    ctx = init_distributed(cfg)
    own_metrics = metrics is None
    m = metrics or Metrics(
        job=cfg.job, rank=ctx.rank, mode=spec.mode, port=cfg.metrics_port, run_dir=cfg.run_dir,
        namespace=cfg.namespace,
    )
    finished = False
    try:
        if (
            ctx.local_rank == 0
        ):  # one rank per machine packs the shards; the others then just map them
            ds = load_dataset(spec)
        dist.barrier()
        if ctx.local_rank != 0:
            ds = load_dataset(spec)
        link = scaling_record.probe_link(ctx.device, ctx.world_size)  # the forecast's link (a fraction of a second)
        amp = make_amp(spec.training.precision, ctx.device)
        inner = build_model(spec, ds)
        if parallel.runs_pipeline(spec):
            from . import pipeline_train  # noqa: PLC0415 - it imports this module

            prun = pipeline_train.setup(cfg, ctx, ds, inner, m)
            prun.scaling.link = link
            keep_until_exit(prun)
            summary = pipeline_train.run_to_end(prun, amp, wall0)
            if ctx.is_main:
                write_summary(cfg, summary)
            mark_finished(cfg, ctx.rank, prun.step)
            finished = True
            return summary
        wrapped = parallel.apply(inner, mesh=ctx, cfg=cfg)
        # Per-rank streams (dropout), after identical init; one stream per tensor-parallel group.
        resume.seed_rank(spec.data.seed, 0, parallel.rng_stream(cfg, ctx.rank))
        optimizer = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
        scheduler = build_scheduler(
            optimizer, spec.optimizer, spec.data.batch_size, spec.training.steps
        )
        dp_rank, dp = parallel.data_shard(cfg, ctx.rank)
        sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, dp_rank, dp)
        comm = parallel.comm_clock_for(wrapped) if m.enabled else None
        r = Run(cfg=cfg, ctx=ctx, ds=ds, model=wrapped, inner=inner, comm=comm, optimizer=optimizer,
                scheduler=scheduler, amp=amp, sampler=sampler, metrics=m)  # fmt: skip
        r.scaling.link = link
        keep_until_exit(r)
        _resume(r)
        if r.summary is not None and r.step >= spec.training.steps:
            summary = r.summary  # a finished run resumed: nothing to train, its figures stand
        else:
            summary = _loop(r)
            summary["wallS"] = time.perf_counter() - wall0
            r.summary = summary
            r.save_checkpoint()
            r.report_checkpoints(wait=True)  # the final write finishes before the trainer reports success
        if ctx.is_main:
            write_summary(cfg, summary)
        mark_finished(cfg, ctx.rank, r.step)
        finished = True
        return summary
    finally:
        if own_metrics:
            m.close()  # the HTTP server thread first: nothing may outlive the process group
        if finished:
            finish()
        else:
            cleanup()


def mark_finished(cfg: TrainerConfig, rank: int, step: int) -> None:
    """Tell the launcher this rank is done, so an abort while exiting is not mistaken for a failure."""
    path = finished_path(cfg.run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": step, "restartAttempt": cfg.restart_attempt}))


def write_summary(cfg: TrainerConfig, summary: dict[str, Any]) -> None:
    text = json.dumps(summary, indent=2, sort_keys=True)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = cfg.run_dir / (SUMMARY_FILE + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, cfg.run_dir / SUMMARY_FILE)
    if cfg.termination_log is not None:
        write_termination_message(cfg.termination_log, summary)


def write_termination_message(path: Path, summary: dict[str, Any]) -> None:
    """The summary as the container's termination message (the operator's status.result)."""
    try:
        Path(path).write_text(scaling_record.termination_message(summary))
    except OSError as e:  # the summary.json is still there; a missing termination log is not fatal
        print(f"disttrain-trainer: cannot write termination log {path}: {e}", flush=True)
