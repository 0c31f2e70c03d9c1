"""The training loop: data -> forward/backward (DDP all-reduce) -> optimizer, with metrics and checkpoints.

Time per step is split three ways and measured, not estimated:
  data    = fetching this rank's rows from the shards and moving them to the device;
  comm    = time with at least one gradient collective in flight (CommTimer, from the DDP hook);
  compute = the forward/backward/optimizer window minus the communication inside it.
step_s is the whole iteration (including bookkeeping), so data+compute+comm ~= step_s
is a real check that nothing unmeasured hides in a step.
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

from . import checkpoint as ckpt
from . import parallel, resume
from .config import SUMMARY_FILE, ConfigError, TrainerConfig, finished_path
from .data import Dataset, GlobalBatchSampler, load_dataset
from .dist_env import DistContext, cleanup, finish, init_distributed
from .metrics import Metrics, StepStats
from .models import build_model, resolve
from .optim import build_optimizer, build_scheduler
from .precision import Amp, make_amp

EVAL_BATCH = 512
# evaluate() names its figure like the metrics log does; the summary speaks the API's camelCase.
SUMMARY_EVAL_KEY = {"test_accuracy": "testAccuracy", "val_loss": "valLoss"}


def check_supported(cfg: TrainerConfig) -> None:
    """Fail fast, before any process group exists, on what this trainer cannot run."""
    spec = cfg.spec
    if spec.mode not in parallel.IMPLEMENTED:
        raise parallel.ModeNotImplemented(spec.mode)
    parts = cfg.world_size * spec.training.grad_accumulation
    if spec.data.batch_size % parts:
        raise ConfigError(
            f"data.batchSize {spec.data.batch_size} must be divisible by world size {cfg.world_size} x "
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
    """Test accuracy (classification) or validation loss (text) of the full held-out set."""
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
    model: nn.Module  # the wrapped (DDP) model
    inner: nn.Module  # the plain module: what checkpoints hold
    timer: parallel.CommTimer
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
    totals: dict[str, float] = field(
        default_factory=lambda: {"step": 0.0, "comm": 0.0, "samples": 0.0}
    )

    def state(self) -> dict[str, Any]:
        # Per-rank parts: RNG streams (dropout) and the comm hook's error feedback (PowerSGD).
        per_rank: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(per_rank, (resume.rng_state(), resume.hook_state(self.comm_hook_state)))
        return {
            "step": self.step,
            "world_size": self.ctx.world_size,
            "model": self.inner.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.amp.scaler.state_dict() if self.amp.scaler is not None else None,
            "sampler": self.sampler.state_dict(),
            "rng": [r for r, _ in per_rank],
            "comm_hook": [h for _, h in per_rank],
            "summary": self.summary,
            "spec_data": {
                "batch_size": self.cfg.spec.data.batch_size,
                "seed": self.cfg.spec.data.seed,
            },
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = self.resumed_from = int(state["step"])
        self.summary = state.get("summary")
        if len(state["rng"]) == self.ctx.world_size:  # same gang shape: each rank continues its own streams
            resume.set_rng_state(state["rng"][self.ctx.rank])
            hooks = state.get("comm_hook") or [None] * self.ctx.world_size
            resume.load_hook_state(self.comm_hook_state, hooks[self.ctx.rank], self.ctx.device)
        else:  # resharded: no saved stream belongs to this rank; error feedback starts empty
            resume.seed_rank(self.cfg.spec.data.seed, self.step, self.ctx.rank)

    @property
    def comm_hook_state(self) -> Any:
        return getattr(self.model, "comm_hook_state", None)

    def save_checkpoint(self) -> None:
        state = self.state()
        if self.ctx.is_main:
            res = ckpt.save(self.cfg.checkpoint_dir, state, self.step, keep=self.cfg.spec.checkpoint.keep,
                            world_size=self.ctx.world_size)  # fmt: skip
            info = [res.seconds, res.bytes]
        else:
            info = [0.0, 0]
        dist.broadcast_object_list(
            info, src=0
        )  # also a barrier: nobody runs ahead of a half-written save
        self.metrics.observe_checkpoint(self.step, float(info[0]), int(info[1]))


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
    run.timer.take()


def _resume(run: Run) -> None:
    root = run.cfg.checkpoint_dir
    loaded = resume.agree_on_checkpoint(root, run.ctx)
    if loaded is None:
        return
    hooks = loaded[1].get("comm_hook") or []
    if len(hooks) == run.ctx.world_size and any(h is not None for h in hooks):
        _settle_buckets(run)
    run.restore(loaded[1])
    if run.ctx.is_main:
        print(f"disttrain-trainer: resumed from step {run.step} ({root})", flush=True)


def _batch(run: Run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = run.ds.batch(run.sampler.next_indices())
    dev = run.ctx.device
    xt, yt = torch.from_numpy(np.asarray(x)).to(dev), torch.from_numpy(np.asarray(y)).to(dev)
    k = run.cfg.spec.training.grad_accumulation
    return list(zip(xt.chunk(k), yt.chunk(k), strict=True))


def _replica_divergence(model: nn.Module) -> float:
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return float((hi - lo).max())


def _loop(run: Run) -> dict[str, Any]:
    spec, ctx = run.cfg.spec, run.ctx
    tr = spec.training
    step_fn = parallel.train_step_for(spec.mode)
    loss_fn = loss_fn_for(run.ds)
    last_loss = float("nan")
    eval_result: tuple[str, float] | None = None
    start = time.perf_counter()
    while run.step < tr.steps:
        t0 = time.perf_counter()
        micro = _batch(run)
        t1 = time.perf_counter()
        res = step_fn(
            run.model,
            micro,
            loss_fn=loss_fn,
            optimizer=run.optimizer,
            scheduler=run.scheduler,
            amp=run.amp,
        )
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        t2 = time.perf_counter()
        comm_s, nbytes = run.timer.take()
        run.step += 1
        last_loss = res.loss
        log = run.step % tr.log_interval_steps == 0 or run.step == tr.steps
        stats = StepStats.from_times(
            step=run.step, loss=res.loss, lr=run.scheduler.get_last_lr()[0], samples=res.samples,
            t0=t0, t1=t1, t2=t2, end=time.perf_counter(), comm_s=comm_s, comm_bytes=nbytes,
        )  # fmt: skip
        step_s = stats.step_s
        run.metrics.observe_step(stats, log=log)
        run.totals["step"] += step_s
        run.totals["comm"] += stats.comm_s
        run.totals["samples"] += res.samples * ctx.world_size
        if log and ctx.is_main:
            print(f"step {run.step}/{tr.steps} loss {res.loss:.4f} lr {stats.lr:.4g} "
                  f"samples/s {res.samples * ctx.world_size / step_s:.0f} comm {stats.comm_fraction:.0%}", flush=True)  # fmt: skip
        if (
            tr.eval_interval_steps
            and run.step % tr.eval_interval_steps == 0
            and run.step < tr.steps
            and ctx.is_main
        ):
            eval_result = evaluate(run.inner, run.ds, run.amp)
            run.metrics.observe_eval(run.step, *eval_result)
        if run.step % spec.checkpoint.interval_steps == 0 and run.step < tr.steps:
            run.save_checkpoint()  # the final one is saved by `run`, with the summary
    train_s = time.perf_counter() - start
    loss_t = torch.tensor([last_loss], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(loss_t)  # the mean over ranks = the loss of the global batch
    divergence = _replica_divergence(run.model)
    if ctx.is_main:
        eval_result = evaluate(run.inner, run.ds, run.amp)
        run.metrics.observe_eval(run.step, *eval_result)
    # camelCase like the rest of the API: this dict becomes the job's status.result.
    summary: dict[str, Any] = {
        "steps": run.step,
        "finalLoss": float(loss_t) / ctx.world_size,
        "resumedFromStep": run.resumed_from,
        "restartAttempt": run.cfg.restart_attempt,
        "worldSize": ctx.world_size,
        "mode": spec.mode,
        "device": ctx.device.type,
        "backend": ctx.backend,
        "precision": tr.precision,
        "trainS": train_s,
        "samplesPerS": run.totals["samples"] / run.totals["step"] if run.totals["step"] else 0.0,
        "commFraction": run.totals["comm"] / run.totals["step"] if run.totals["step"] else 0.0,
        "replicaMaxAbsDiff": divergence,
    }
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    return summary


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
        amp = make_amp(spec.training.precision, ctx.device)
        inner = build_model(spec, ds)
        wrapped, timer = parallel.apply(inner, mesh=ctx, cfg=cfg)
        resume.seed_rank(spec.data.seed, 0, ctx.rank)  # per-rank streams (dropout), after identical init
        optimizer = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
        scheduler = build_scheduler(
            optimizer, spec.optimizer, spec.data.batch_size, spec.training.steps
        )
        sampler = GlobalBatchSampler(
            ds.num_train, spec.data.batch_size, spec.data.seed, ctx.rank, ctx.world_size
        )
        r = Run(cfg=cfg, ctx=ctx, ds=ds, model=wrapped, inner=inner, timer=timer, optimizer=optimizer,
                scheduler=scheduler, amp=amp, sampler=sampler, metrics=m)  # fmt: skip
        _resume(r)
        if r.summary is not None and r.step >= spec.training.steps:
            summary = r.summary  # a finished run resumed: nothing to train, its figures stand
        else:
            summary = _loop(r)
            summary["wallS"] = time.perf_counter() - wall0
            r.summary = summary
            r.save_checkpoint()
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
        try:
            Path(cfg.termination_log).write_text(json.dumps(summary, sort_keys=True))
        except (
            OSError
        ) as e:  # the summary.json is still there; a missing termination log is not fatal
            print(
                f"disttrain-trainer: cannot write termination log {cfg.termination_log}: {e}",
                flush=True,
            )
