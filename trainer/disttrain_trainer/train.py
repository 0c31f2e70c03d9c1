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
import random
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
from . import parallel
from . import sharded_checkpoint as sharded_ckpt
from .config import ConfigError, TrainerConfig
from .data import Dataset, GlobalBatchSampler, load_dataset
from .dist_env import DistContext, cleanup, init_distributed
from .metrics import Metrics, StepStats
from .models import build_model
from .optim import build_optimizer, build_scheduler
from .precision import Amp, make_amp

EVAL_BATCH = 512


def check_supported(cfg: TrainerConfig) -> None:
    """Fail fast, before any process group exists, on what this trainer cannot run."""
    spec = cfg.spec
    if spec.mode not in parallel.IMPLEMENTED:
        raise parallel.ModeNotImplemented(spec.mode)
    dp = parallel.data_shard(cfg, 0)[1]
    parts = dp * spec.training.grad_accumulation
    if spec.data.batch_size % parts:
        raise ConfigError(
            f"data.batchSize {spec.data.batch_size} must be divisible by data-parallel degree {dp} x "
            f"training.gradAccumulation {spec.training.grad_accumulation} = {parts}"
        )


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

    A sharded model (tensor parallel, FSDP) needs every rank here; its vocabulary-sharded
    logits go through loss_parallel's cross-entropy (a no-op for plain tensors)."""
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


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if (
        "cuda" in state
        and torch.cuda.is_available()
        and len(state["cuda"]) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass(kw_only=True)
class Run:
    cfg: TrainerConfig
    ctx: DistContext
    ds: Dataset
    model: nn.Module  # the wrapped (DDP) model
    inner: nn.Module  # the plain module: what checkpoints hold
    timer: parallel.CommTimer | parallel.ProfiledComm
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    amp: Amp
    sampler: GlobalBatchSampler
    metrics: Metrics
    step: int = 0
    resumed_from: int | None = None
    totals: dict[str, float] = field(
        default_factory=lambda: {"step": 0.0, "comm": 0.0, "samples": 0.0}
    )

    def state(self) -> dict[str, Any]:
        rngs: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(rngs, _rng_state())
        return {
            "step": self.step,
            "world_size": self.ctx.world_size,
            "model": self.inner.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.amp.scaler.state_dict() if self.amp.scaler is not None else None,
            "sampler": self.sampler.state_dict(),
            "rng": rngs,
            "spec_data": {
                "batch_size": self.cfg.spec.data.batch_size,
                "seed": self.cfg.spec.data.seed,
            },
        }

    def restore(self, state: dict[str, Any]) -> None:
        """`state` without model and optimizer: sharded_checkpoint.load has restored those."""
        if "model" in state:
            self.inner.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        rngs = state["rng"]
        # Same world size: every rank gets its own streams back. Different: reuse rank 0's on all ranks.
        _set_rng_state(rngs[self.ctx.rank] if len(rngs) == self.ctx.world_size else rngs[0])
        self.step = self.resumed_from = int(state["step"])

    def save_checkpoint(self) -> None:
        state = self.state()
        if parallel.is_sharded(self.inner):  # every rank writes its shards (DCP)
            extra = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
            res = sharded_ckpt.save(self.cfg.checkpoint_dir, self.step, model=self.inner, optimizer=self.optimizer,
                                    extra=extra, keep=self.cfg.spec.checkpoint.keep,
                                    layout=parallel.layout(self.cfg).describe())  # fmt: skip
            self.metrics.observe_checkpoint(self.step, res.seconds, res.bytes)
            return
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


def _resume(run: Run) -> None:
    root = run.cfg.checkpoint_dir
    if run.ctx.is_main:
        ckpt.clean_partial(root)
        found = sharded_ckpt.list_checkpoints(root)
        choice = [found[-1][0] if found else None]
    else:
        choice = [None]
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return
    path = root / ckpt.name_for(choice[0])
    if parallel.is_sharded(run.inner) or sharded_ckpt.is_sharded_checkpoint(path):
        # Either format into whatever layout this run has (resharding: sharded_checkpoint.py).
        run.restore(sharded_ckpt.load(path, model=run.inner, optimizer=run.optimizer))
        if run.ctx.is_main:
            print(f"disttrain-trainer: resumed from step {run.step} ({path})", flush=True)
        return
    # Every rank reads the same step (the checkpoint volume is shared by contract).
    loaded = ckpt.load_latest(root)
    if loaded is None or loaded[0] != choice[0]:
        raise ConfigError(
            f"rank {run.ctx.rank} cannot read checkpoint step {choice[0]} under {root}; "
            "the checkpoint volume must be shared by all workers (checkpoint.volume)"
        )
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
    step_fn = parallel.train_step_for(spec.mode, run.timer)
    dp = parallel.data_shard(run.cfg, ctx.rank)[1]  # ranks of one tensor group share their samples
    sharded = parallel.is_sharded(run.inner)
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
        run.totals["samples"] += res.samples * dp
        if log and ctx.is_main:
            print(f"step {run.step}/{tr.steps} loss {res.loss:.4f} lr {stats.lr:.4g} "
                  f"samples/s {res.samples * dp / step_s:.0f} comm {stats.comm_fraction:.0%}", flush=True)  # fmt: skip
        if (
            tr.eval_interval_steps
            and run.step % tr.eval_interval_steps == 0
            and run.step < tr.steps
            and (ctx.is_main or sharded)
        ):
            eval_result = evaluate(run.inner, run.ds, run.amp)
            if ctx.is_main:
                run.metrics.observe_eval(run.step, *eval_result)
        if run.step % spec.checkpoint.interval_steps == 0 or run.step == tr.steps:
            run.save_checkpoint()
    train_s = time.perf_counter() - start
    loss_t = torch.tensor([last_loss], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(loss_t)  # the mean over ranks = the loss of the global batch
    # Sharded parameters differ between ranks by design; replicas are compared in ddp only.
    divergence = None if sharded else _replica_divergence(run.model)
    if ctx.is_main or sharded:
        eval_result = evaluate(run.inner, run.ds, run.amp)
        if ctx.is_main:
            run.metrics.observe_eval(run.step, *eval_result)
    summary: dict[str, Any] = {
        "steps": run.step,
        "final_loss": float(loss_t) / ctx.world_size,
        "resumed_from_step": run.resumed_from,
        "restart_attempt": run.cfg.restart_attempt,
        "world_size": ctx.world_size,
        "mode": spec.mode,
        "layout": parallel.layout(run.cfg).describe(),
        "data_strategy": spec.parallelism.data_strategy,
        "device": ctx.device.type,
        "backend": ctx.backend,
        "precision": tr.precision,
        "train_s": train_s,
        "samples_per_s": run.totals["samples"] / run.totals["step"] if run.totals["step"] else 0.0,
        "comm_fraction": run.totals["comm"] / run.totals["step"] if run.totals["step"] else 0.0,
        "replica_max_abs_diff": divergence,
    }
    if eval_result is not None:
        summary[eval_result[0]] = eval_result[1]
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
        stream = parallel.seed_rank(cfg, ctx.rank)  # per-rank streams (dropout), after identical init
        torch.manual_seed(spec.data.seed * 1000 + stream)
        np.random.seed(spec.data.seed * 1000 + stream)
        random.seed(spec.data.seed * 1000 + stream)
        optimizer = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
        scheduler = build_scheduler(
            optimizer, spec.optimizer, spec.data.batch_size, spec.training.steps
        )
        dp_rank, dp = parallel.data_shard(cfg, ctx.rank)
        sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, dp_rank, dp)
        r = Run(cfg=cfg, ctx=ctx, ds=ds, model=wrapped, inner=inner, timer=timer, optimizer=optimizer,
                scheduler=scheduler, amp=amp, sampler=sampler, metrics=m)  # fmt: skip
        _resume(r)
        summary = _loop(r)
        summary["wall_s"] = time.perf_counter() - wall0
        if ctx.is_main:
            write_summary(cfg, summary)
        return summary
    finally:
        if own_metrics:
            m.close()
        cleanup()


def write_summary(cfg: TrainerConfig, summary: dict[str, Any]) -> None:
    text = json.dumps(summary, indent=2, sort_keys=True)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = cfg.run_dir / "summary.json.tmp"
    tmp.write_text(text)
    os.replace(tmp, cfg.run_dir / "summary.json")
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
