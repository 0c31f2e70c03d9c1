"""Benchmark of the data-parallel trainer's own machinery, on 2 gloo processes.

One run prints side-by-side comparisons, each against what the same work costs
without disttrain in the way:

  (a) gradient all-reduce throughput inside a DDP step, from DDP's reducer timer
      (busy communication, the trainer's metric), vs raw `all_reduce` of the same
      bucket sizes issued back to back with the ranks aligned by a barrier   (diagnostic)
  (b) the trainer's loop with metrics on vs the same trainer with metrics off
      (`Metrics(enabled=False)`: no reducer timing, no Prometheus, no JSON lines):
      whole `modes/data/entry.run` calls, alternating on/off           target: overhead <= 3%
  (b') (diagnostic) the communication timing alone, on/off every 5 steps in one gang
  (c) checkpoints: the loop's stall for an asynchronous save (`Run.save_checkpoint`:
      snapshot to host memory while the RNG gather runs) vs a synchronous save of the
      same state (`Run.state` + `checkpoint.save`)           target: stall <= 20%
      and the background write's throughput (serialise, fsync, rename, fsync the dir,
      prune) vs a raw write + fsync of the same bytes        target: >= 0.8
  (c') (diagnostic) the loop's barrier right after the async save, on rank 0: it waits for
      the RNG gather and shares the cores with the writer thread

It drives the trainer's own code (process/, datasets, models, parallel/, telemetry/,
checkpoints/, the data mode): that is what is being measured. Warmups first,
then medians; the sides alternate so drift from other load hits all alike.

    .venv/bin/python benchmarks/ddp_sync.py [--bucket-mb 25 --runs 6 --json out.json --strict]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from disttrain_api import constants as C
from disttrain_api import model as api
from disttrain_trainer.checkpoints import whole as ckpt
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.models import build_model
from disttrain_trainer.modes.data import entry as data_mode
from disttrain_trainer.modes.data import layouts
from disttrain_trainer.modes.data.run_state import Run
from disttrain_trainer.optim import build_optimizer, build_scheduler
from disttrain_trainer.parallel.ddp import CommTimes, train_step
from disttrain_trainer.process.config import config_for
from disttrain_trainer.process.dist_env import cleanup, init_distributed
from disttrain_trainer.process.precision import make_amp
from disttrain_trainer.run_common import loss_fn_for
from disttrain_trainer.telemetry.step_metrics import Metrics

WORLD = 2
MB = 1e6
TARGETS = {"metrics_overhead": 0.03, "stall_ratio": 0.20, "write_ratio": 0.8}


@dataclass(frozen=True, kw_only=True)
class Args:
    hidden: int
    layers: int
    batch: int
    bucket_mb: float
    steps: int
    runs: int
    comm_steps: int
    ckpt_repeats: int
    log_interval: int
    workdir: str


def _spec(a: Args, steps: int) -> api.JobSpec:
    return api.parse_spec({
        "mode": "data",
        "workers": {"replicas": WORLD},
        "model": {"name": "mlp", "hidden": a.hidden, "layers": a.layers},
        "data": {"name": "synthetic", "batchSize": a.batch, "seed": 0, "shards": 2, "syntheticSamples": 16384},
        "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "decay": "none"},
        "training": {"steps": steps, "bucketCapMB": a.bucket_mb, "logIntervalSteps": a.log_interval},
        "checkpoint": {"intervalSteps": steps, "keep": 2},
    })  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ------------------------------------------------------------------ (b) whole trainer runs


def _trainer_run(rank: int, a: Args, port: int, job: str, metrics_on: bool, out: str) -> None:
    torch.set_num_threads(1)  # 2 processes on 2 cores: one compute thread each, as `disttrain local` sets
    work = Path(a.workdir)
    cfg = config_for(_spec(a, a.steps), job=job, rank=rank, world_size=WORLD, run_dir=work / "runs" / job,
                     checkpoint_root=work / "ckpt", master_port=port, metrics_port=0)  # fmt: skip
    os.environ[C.ENV_DATA_CACHE] = str(work / "data")
    m = Metrics(job=job, rank=rank, mode="data", port=_free_port() if metrics_on else 0,
                run_dir=cfg.run_dir, enabled=metrics_on)  # fmt: skip
    try:
        summary = data_mode.run(cfg, metrics=m)
    finally:
        m.close()
    if rank == 0:
        Path(out).write_text(json.dumps(summary))


def metrics_overhead(a: Args) -> dict[str, Any]:
    on: list[float] = []
    off: list[float] = []
    for i in range(a.runs + 1):  # the first pair warms the page cache and the data shards
        order = (True, False) if i % 2 else (False, True)
        for metrics_on in order:
            out = os.path.join(a.workdir, f"b-{i}-{metrics_on}.json")
            job = f"b{i}{'on' if metrics_on else 'off'}"
            mp.start_processes(_trainer_run, args=(a, _free_port(), job, metrics_on, out), nprocs=WORLD,
                               start_method="spawn")  # fmt: skip
            if i:
                (on if metrics_on else off).append(json.loads(Path(out).read_text())["trainS"])
    return {
        "loop_on_s": on,
        "loop_off_s": off,
        "overhead_paired": _med([x / y - 1 for x, y in zip(on, off, strict=True)]),
        "step_on_ms": _med(on) / a.steps * 1e3,
        "step_off_ms": _med(off) / a.steps * 1e3,
    }


# ------------------------------------------------------------------ (a) and (c) in one gang


def _worker(rank: int, a: Args, port: int, out: str) -> None:
    torch.set_num_threads(1)
    spec = _spec(a, 10**6)
    work = Path(a.workdir)
    cfg = config_for(spec, job="bench", rank=rank, world_size=WORLD, run_dir=work / "run",
                     checkpoint_root=work / "ckpt", master_port=port, metrics_port=0)  # fmt: skip
    ctx = init_distributed(cfg)
    try:
        if rank == 0:
            ds = load_dataset(spec, work / "data")
        dist.barrier()
        if rank != 0:
            ds = load_dataset(spec, work / "data")
        amp = make_amp("fp32", ctx.device)
        loss_fn = loss_fn_for(ds)
        inner = build_model(spec, ds)
        model = layouts.apply(inner, mesh=ctx, cfg=cfg)
        clock = layouts.comm_clock_for(model)
        assert clock is not None
        opt = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
        sched = build_scheduler(opt, spec.optimizer, spec.data.batch_size, spec.training.steps)
        sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, rank, WORLD)
        metrics = Metrics(job="bench", rank=rank, mode="data", port=0, run_dir=None)

        def step() -> CommTimes:
            x, y = ds.batch(sampler.next_indices())
            train_step(model, [(torch.from_numpy(x), torch.from_numpy(y))], loss_fn=loss_fn, optimizer=opt,
                       scheduler=sched, amp=amp)  # fmt: skip
            return clock.take()

        for _ in range(5):  # DDP rebuilds its buckets after the first step
            step()
        # (a) busy communication inside DDP steps vs raw all_reduce of the same buckets.
        buckets = [int(b) for b in model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", ")]
        grad_bytes = sum(buckets)
        busy = [step().busy_s for _ in range(a.comm_steps)]
        # (b') the same step, DDP's reducer timing on (sample rate 1, read every step) or off (DDP's
        # default), alternating every 5 steps inside one gang: immune to load drift between runs.
        ab: dict[bool, list[float]] = {True: [], False: []}
        for i in range(4 * a.comm_steps):
            on = (i // 5) % 2 == 0
            model._set_ddp_runtime_logging_sample_rate(1 if on else 100)
            t0 = time.perf_counter()
            x, y = ds.batch(sampler.next_indices())
            train_step(model, [(torch.from_numpy(x), torch.from_numpy(y))], loss_fn=loss_fn, optimizer=opt,
                       scheduler=sched, amp=amp)  # fmt: skip
            if on:
                clock.take()
            ab[on].append(time.perf_counter() - t0)
        model._set_ddp_runtime_logging_sample_rate(1)
        bufs = [torch.randn(n // 4) for n in buckets]
        raw: list[float] = []
        for i in range(a.comm_steps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            for w in [dist.all_reduce(b, async_op=True) for b in bufs]:
                w.wait()
            if i >= 3:
                raw.append(time.perf_counter() - t0)

        # (c) checkpoints of the trainer's full state (model, optimizer, scheduler, sampler, RNG).
        run = Run(cfg=cfg, ctx=ctx, ds=ds, model=model, inner=inner, comm=clock, optimizer=opt,
                          scheduler=sched, amp=amp, sampler=sampler, metrics=metrics, step=1000)  # fmt: skip
        sync_s: list[float] = []
        stall_s: list[float] = []
        barrier_s: list[float] = []
        write_mbs: list[float] = []
        raw_mbs: list[float] = []
        nbytes = 0
        raw_dir = work / "raw"
        raw_dir.mkdir(parents=True, exist_ok=True)
        for i in range(a.ckpt_repeats + 1):  # the first round is a warmup
            run.step = 2000 + 2 * i
            dist.barrier()
            t0 = time.perf_counter()
            state = run.state()  # collective: all ranks
            if rank == 0:
                ckpt.save(cfg.checkpoint_dir, state, run.step, keep=2, world_size=WORLD)
            t_sync = time.perf_counter() - t0
            dist.barrier()
            for _ in range(3):
                step()
            run.step += 1
            dist.barrier()
            t0 = time.perf_counter()
            run.save_checkpoint()  # what the loop pays: snapshot while the RNG gather runs; the write goes on behind
            t_stall = time.perf_counter() - t0
            dist.barrier()  # the loop's barrier after a checkpoint (it also waits for the RNG gather)
            t_barrier = time.perf_counter() - t0 - t_stall
            done = run.saver.wait() if run.saver is not None else []
            if rank == 0:
                res = done[-1]
                buf = io.BytesIO()
                torch.save(state, buf)
                blob = buf.getvalue()
                path = raw_dir / f"raw-{i}.bin"
                t0 = time.perf_counter()
                with open(path, "wb") as f:
                    f.write(blob)
                    f.flush()
                    os.fsync(f.fileno())
                raw_dt = time.perf_counter() - t0
                path.unlink()
                nbytes = res.bytes
                if i:
                    sync_s.append(t_sync)
                    stall_s.append(t_stall)
                    barrier_s.append(t_barrier)
                    write_mbs.append(res.bytes / res.seconds / MB)
                    raw_mbs.append(len(blob) / raw_dt / MB)
            for _ in range(3):
                step()
        dist.barrier()
        metrics.close()
        if rank == 0:
            result = {
                "params": sum(p.numel() for p in inner.parameters()),
                "grad_bytes": grad_bytes,
                "buckets": buckets,
                "ddp_busy_ms": _med(busy) * 1e3,
                "ddp_busy_MBps": grad_bytes / _med(busy) / MB,
                "raw_allreduce_ms": _med(raw) * 1e3,
                "raw_allreduce_MBps": grad_bytes / _med(raw) / MB,
                "ab_on_ms": _med(ab[True]) * 1e3,
                "ab_off_ms": _med(ab[False]) * 1e3,
                "sync_save_ms": _med(sync_s) * 1e3,
                "stall_ms": _med(stall_s) * 1e3,
                "barrier_after_ms": _med(barrier_s) * 1e3,
                "stall_ratio": _med([s / y for s, y in zip(stall_s, sync_s, strict=True)]),
                "write_MBps": _med(write_mbs),
                "raw_write_MBps": _med(raw_mbs),
                "ckpt_bytes": nbytes,
            }
            Path(out).write_text(json.dumps(result))
    finally:
        cleanup()


def _table(r: dict[str, Any], a: Args) -> str:
    overhead = r["overhead_paired"]
    write_ratio = r["write_MBps"] / r["raw_write_MBps"]
    ok = {
        "metrics": overhead <= TARGETS["metrics_overhead"],
        "stall": r["stall_ratio"] <= TARGETS["stall_ratio"],
        "write": write_ratio >= TARGETS["write_ratio"],
    }

    def verdict(key: str) -> str:
        return "met" if ok[key] else "MISSED"

    return "\n".join([
        f"2 gloo processes, 1 thread each; MLP {r['params'] / 1e6:.2f} M params, {r['grad_bytes'] / MB:.1f} MB "
        f"of fp32 gradients in {len(r['buckets'])} bucket(s) (bucketCapMB {a.bucket_mb}), global batch {a.batch}; "
        f"(b) {a.runs} trainer runs per side of {a.steps} steps, alternating; (c) {a.ckpt_repeats} saves per side; "
        f"load average {os.getloadavg()[0]:.1f}",
        "",
        "| measurement | disttrain | reference | ratio | target | |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| (a) gradient all-reduce throughput inside a DDP step (busy, DDP's reducer timer) "
        f"| {r['ddp_busy_MBps']:.0f} MB/s ({r['ddp_busy_ms']:.1f} ms/step) | {r['raw_allreduce_MBps']:.0f} MB/s raw "
        f"all_reduce, same buckets, ranks aligned ({r['raw_allreduce_ms']:.1f} ms) "
        f"| {r['ddp_busy_MBps'] / r['raw_allreduce_MBps']:.2f} | (diagnostic) | |",
        f"| (b) trainer loop, metrics on vs off | {r['step_on_ms']:.2f} ms/step | {r['step_off_ms']:.2f} ms/step "
        f"| {overhead * 100:+.1f}% (median of paired runs) | <= +3% | {verdict('metrics')} |",
        f"| (b') the same step, reducer timing + read on vs off, alternating every 5 steps in one gang "
        f"| {r['ab_on_ms']:.2f} ms | {r['ab_off_ms']:.2f} ms | {(r['ab_on_ms'] / r['ab_off_ms'] - 1) * 100:+.1f}% "
        "| (diagnostic) | |",
        f"| (c) loop stall for a checkpoint ({r['ckpt_bytes'] / MB:.1f} MB): async save vs synchronous save "
        f"| {r['stall_ms']:.1f} ms | {r['sync_save_ms']:.1f} ms | {r['stall_ratio']:.2f} | <= 0.20 | {verdict('stall')} |",
        f"| (c) background checkpoint write throughput | {r['write_MBps']:.0f} MB/s | {r['raw_write_MBps']:.0f} MB/s "
        f"raw write + fsync | {write_ratio:.2f} | >= 0.8 | {verdict('write')} |",
        f"| (c') the loop's barrier after an async save (rank 0; the write thread shares the 2 cores) "
        f"| {r['barrier_after_ms']:.1f} ms | | | (diagnostic) | |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucketCapMB (the API default: 25)")
    p.add_argument("--steps", type=int, default=100, help="steps per trainer run in (b)")
    p.add_argument("--runs", type=int, default=6, help="trainer runs per side in (b)")
    p.add_argument("--comm-steps", type=int, default=40, help="steps measured in (a)")
    p.add_argument("--ckpt-repeats", type=int, default=5)
    p.add_argument("--log-interval", type=int, default=10, help="logIntervalSteps of the (b) runs")
    p.add_argument("--dir", default=None, help="work dir; default: a temp dir")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="disttrain-bench-", dir=ns.dir) as work:
        a = Args(hidden=ns.hidden, layers=ns.layers, batch=ns.batch, bucket_mb=ns.bucket_mb, steps=ns.steps,
                 runs=ns.runs, comm_steps=ns.comm_steps, ckpt_repeats=ns.ckpt_repeats,
                 log_interval=ns.log_interval, workdir=work)  # fmt: skip
        out = os.path.join(work, "result.json")
        mp.start_processes(_worker, args=(a, _free_port(), out), nprocs=WORLD, start_method="spawn")
        result = json.loads(Path(out).read_text())
        result |= metrics_overhead(a)
    print(_table(result, a))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    missed = (
        result["overhead_paired"] > TARGETS["metrics_overhead"]
        or result["stall_ratio"] > TARGETS["stall_ratio"]
        or result["write_MBps"] / result["raw_write_MBps"] < TARGETS["write_ratio"]
    )
    return 1 if ns.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
