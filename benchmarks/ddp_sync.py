"""Benchmark of the data-parallel trainer's own machinery, on 2 gloo processes.

One run prints three side-by-side comparisons, each against what the same
bytes cost without disttrain in the way:

  (a) communication throughput inside a DDP step, as the trainer measures it
      (CommTimer around every bucket's all-reduce), vs raw `all_reduce` of the
      same buckets (same sizes, issued back to back, async)    target >= 0.8
  (b) step time with metrics on (timed comm hook + Prometheus + JSON lines)
      vs off (torch's DDP with its built-in all-reduce, no bookkeeping)
                                                                target <= +3%
  (c) checkpoint.save() MB/s (serialise, fsync, rename, prune) vs a raw
      sequential write + fsync of the same bytes              target >= 0.5

Two diagnostic rows explain the headline ones: (a') the same DDP figure vs
an all_reduce issued after backward in a plain (non-DDP) loop, which pays the
same rank skew; (b') the metrics bookkeeping timed directly per step.

It drives the trainer's code (config, dist_env, data, models, parallel.data,
metrics, checkpoint, train.Run.state): that is what is being measured.
Warmups first, then medians over repeats; the on/off/plain steps alternate
one by one (order swapped every other pair) so drift from other load on the
machine hits every side alike.

    .venv/bin/python benchmarks/ddp_sync.py [--bucket-mb 25 --rounds 8 --json out.json --strict]
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
from disttrain_api import model as api
from disttrain_trainer import checkpoint as ckpt
from disttrain_trainer import parallel
from disttrain_trainer.config import config_for
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.dist_env import cleanup, init_distributed
from disttrain_trainer.metrics import Metrics, StepStats
from disttrain_trainer.models import build_model
from disttrain_trainer.optim import build_optimizer, build_scheduler
from disttrain_trainer.parallel.data import train_step
from disttrain_trainer.precision import make_amp
from disttrain_trainer.train import Run, loss_fn_for
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
MB = 1e6
TARGETS = {"comm_ratio": 0.8, "metrics_overhead": 0.03, "checkpoint_ratio": 0.5}


@dataclass(frozen=True, kw_only=True)
class Args:
    hidden: int
    layers: int
    batch: int
    bucket_mb: float
    warmup: int
    steps: int
    rounds: int
    ckpt_repeats: int
    log_interval: int
    workdir: str


def _spec(a: Args) -> api.JobSpec:
    return api.parse_spec(
        {
            "mode": "data",
            "workers": {"replicas": WORLD},
            "model": {"name": "mlp", "hidden": a.hidden, "layers": a.layers},
            "data": {
                "name": "synthetic",
                "batchSize": a.batch,
                "seed": 0,
                "shards": 2,
                "syntheticSamples": 16384,
            },
            "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "decay": "none"},
            "training": {
                "steps": 10**6,
                "bucketCapMB": a.bucket_mb,
                "logIntervalSteps": a.log_interval,
            },
        }
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _worker(rank: int, a: Args, port: int, metrics_ports: list[int], out: str) -> None:
    torch.set_num_threads(
        1
    )  # 2 processes on 2 cores: one compute thread each, as `disttrain local` sets
    spec = _spec(a)
    work = Path(a.workdir)
    cfg = config_for(spec, job="bench", rank=rank, world_size=WORLD, run_dir=work / "run",
                     checkpoint_root=work / "ckpt", master_port=port, metrics_port=metrics_ports[rank])  # fmt: skip
    ctx = init_distributed(cfg)
    try:
        if rank == 0:
            ds = load_dataset(spec, work / "data")
        dist.barrier()
        if rank != 0:
            ds = load_dataset(spec, work / "data")
        amp = make_amp("fp32", ctx.device)
        loss_fn = loss_fn_for(ds)

        def make(instrumented: bool) -> tuple[Any, ...]:
            inner = build_model(spec, ds)
            if instrumented:  # the trainer's DDP: timed comm hook
                model, timer = parallel.apply(inner, mesh=ctx, cfg=cfg)
            else:  # torch's DDP as it comes: built-in all-reduce, nothing timed
                model, timer = DDP(inner, bucket_cap_mb=a.bucket_mb, broadcast_buffers=False), None
            opt = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
            sched = build_scheduler(opt, spec.optimizer, spec.data.batch_size, spec.training.steps)
            sampler = GlobalBatchSampler(
                ds.num_train, spec.data.batch_size, spec.data.seed, rank, WORLD
            )
            return inner, model, timer, opt, sched, sampler

        on = make(True)
        off = make(False)
        metrics_on = Metrics(
            job="bench", rank=rank, mode="data", port=cfg.metrics_port, run_dir=cfg.run_dir
        )
        bucket_log: list[int] = []
        timer = on[2]
        add = timer.add

        span_log: list[tuple[float, float]] = []

        def recording_add(start: float, end: float, nbytes: int) -> None:
            bucket_log.append(
                nbytes
            )  # sizes of the buckets DDP actually reduced, for the raw baseline
            span_log.append((start, end))  # the CommTimer's own intervals, for the aligned figure
            add(start, end, nbytes)

        timer.add = recording_add  # type: ignore[method-assign]
        step_no = [0, 0]
        step_spans: list[tuple[float, float]] = []
        book_s: list[float] = []

        def step(
            which: tuple[Any, ...], metrics: Metrics | None, idx: int
        ) -> tuple[float, float, int]:
            inner, model, tmr, opt, sched, sampler = which
            t0 = time.perf_counter()
            x, y = ds.batch(sampler.next_indices())
            xt, yt = torch.from_numpy(x), torch.from_numpy(y)
            t1 = time.perf_counter()
            res = train_step(
                model, [(xt, yt)], loss_fn=loss_fn, optimizer=opt, scheduler=sched, amp=amp
            )
            t2 = time.perf_counter()
            comm_s, nbytes = (0.0, 0)
            step_no[idx] += 1
            if metrics is not None:
                comm_s, nbytes = tmr.take()
                if span_log:  # this step's first hook call and last completion on this rank
                    step_spans.append((min(b for b, _ in span_log), max(e for _, e in span_log)))
                span_log.clear()
                stats = StepStats.from_times(  # the trainer's own accounting (train._loop)
                    step=step_no[idx], loss=res.loss, lr=sched.get_last_lr()[0], samples=res.samples,
                    t0=t0, t1=t1, t2=t2, end=time.perf_counter(), comm_s=comm_s, comm_bytes=nbytes,
                )  # fmt: skip
                comm_s = stats.comm_s
                metrics.observe_step(stats, log=step_no[idx] % a.log_interval == 0)
                book_s.append(time.perf_counter() - t2)  # the bookkeeping alone, timed directly
            return time.perf_counter() - t0, comm_s, nbytes

        # Warmup: DDP rebuilds its buckets after the first step; the allocator settles.
        for _ in range(a.warmup):
            bucket_log.clear()
            step(on, metrics_on, 0)
            step(off, None, 1)
        on[2].take()
        book_s.clear()
        step_spans.clear()
        buckets = list(bucket_log)  # bytes of each bucket DDP reduced in one (post-rebuild) step

        # Baseline for (a) inside a training loop: a plain model, backward, then all_reduce of
        # the same bucket sizes (no DDP, no hook): same rank skew, no overlap with backward.
        plain = build_model(spec, ds)
        plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
        splits = [n // 4 for n in buckets]

        def plain_step() -> float:
            x, y = ds.batch(on[5].next_indices())
            plain_opt.zero_grad(set_to_none=True)
            loss_fn(plain(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            grads = [p.grad.reshape(-1) for p in plain.parameters() if p.grad is not None]
            flat = torch.cat(grads)
            chunks = list(torch.split(flat, splits)) if sum(splits) == flat.numel() else [flat]
            t0 = time.perf_counter()
            works = [dist.all_reduce(c, async_op=True) for c in chunks]
            for w in works:
                w.wait()
            dt = time.perf_counter() - t0
            plain_opt.step()
            return dt

        # (a) + (b): metrics on / off / plain, alternating step by step so drift hits all alike.
        t_on: list[float] = []
        t_off: list[float] = []
        ddp_tput: list[float] = []
        comm_s_all: list[float] = []
        loop_s: list[float] = []
        dist.barrier()
        for i in range(a.rounds * a.steps):
            if i % 2:  # swap the order every other pair: neither side always runs first
                t_off.append(step(off, None, 1)[0])
            dt, comm_s, nbytes = step(on, metrics_on, 0)
            t_on.append(dt)
            if comm_s > 0:
                ddp_tput.append(nbytes / comm_s)
                comm_s_all.append(comm_s)
            if not i % 2:
                t_off.append(step(off, None, 1)[0])
            loop_s.append(plain_step())
        loop_tput = [sum(buckets) / dt for dt in loop_s]

        # (a) aligned: the same CommTimer intervals, but counted from the moment the LAST rank's
        # hook fired (a collective cannot start before every rank joins), as the raw baseline's
        # barrier does. Both ranks run on one host, so perf_counter (CLOCK_MONOTONIC) is shared.
        all_spans: list[list[tuple[float, float]]] = [[] for _ in range(WORLD)]
        dist.all_gather_object(all_spans, step_spans)
        aligned_s = [
            max(sp[i][1] for sp in all_spans) - max(sp[i][0] for sp in all_spans)
            for i in range(min(len(sp) for sp in all_spans))
        ]
        aligned_tput = [sum(buckets) / dt for dt in aligned_s if dt > 0]

        # (a) raw all_reduce of the same buckets in isolation (ranks aligned by a barrier),
        # issued back to back as DDP's reducer does: what gloo moves on this machine.
        bufs = [torch.randn(n // 4) for n in buckets]
        raw_tput: list[float] = []
        raw_s: list[float] = []
        for i in range(a.warmup + a.rounds * a.steps):
            dist.barrier()
            t0 = time.perf_counter()
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
            for w in works:
                w.wait()
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                raw_tput.append(sum(buckets) / dt)
                raw_s.append(dt)

        # (c) checkpoints of the trainer's full state (model, optimizer, scheduler, sampler, RNG).
        inner, model, tmr, opt, sched, sampler = on
        run = Run(cfg=cfg, ctx=ctx, ds=ds, model=model, inner=inner, timer=tmr, optimizer=opt, scheduler=sched,
                  amp=amp, sampler=sampler, metrics=metrics_on, step=step_no[0])  # fmt: skip
        state = run.state()  # collective (gathers every rank's RNG): all ranks call it
        ck_mbs: list[float] = []
        raw_mbs: list[float] = []
        nbytes = 0
        if rank == 0:
            buf = io.BytesIO()
            torch.save(state, buf)
            blob = buf.getvalue()
            root = work / "ckpt" / "bench"
            raw_dir = work / "raw"
            raw_dir.mkdir(parents=True, exist_ok=True)
            for i in range(a.ckpt_repeats + 1):  # the first pair is a warmup
                res = ckpt.save(root, state, 1000 + i, keep=2, world_size=WORLD)
                t0 = time.perf_counter()
                path = raw_dir / f"raw-{i}.bin"
                with open(path, "wb") as f:
                    f.write(blob)
                    f.flush()
                    os.fsync(f.fileno())
                raw_dt = time.perf_counter() - t0
                path.unlink()
                nbytes = res.bytes
                if i:
                    ck_mbs.append(res.bytes / res.seconds / MB)
                    raw_mbs.append(len(blob) / raw_dt / MB)
        dist.barrier()
        metrics_on.close()
        if rank == 0:
            result = {
                "params": sum(p.numel() for p in inner.parameters()),
                "grad_bytes": sum(buckets),
                "buckets": buckets,
                "ddp_comm_MBps": _med(ddp_tput) / MB,
                "ddp_aligned_MBps": _med(aligned_tput) / MB,
                "ddp_aligned_ms": _med(aligned_s) * 1e3,
                "ddp_comm_ms": _med(comm_s_all) * 1e3,
                "raw_allreduce_MBps": _med(raw_tput) / MB,
                "raw_allreduce_ms": _med(raw_s) * 1e3,
                "loop_allreduce_MBps": _med(loop_tput) / MB,
                "loop_allreduce_ms": _med(loop_s) * 1e3,
                "step_on_ms": _med(t_on) * 1e3,
                "step_off_ms": _med(t_off) * 1e3,
                "overhead_paired": _med([x / y - 1 for x, y in zip(t_on, t_off, strict=True)]),
                "bookkeeping_us": _med(book_s) * 1e6,
                "ckpt_MBps": _med(ck_mbs),
                "raw_write_MBps": _med(raw_mbs),
                "ckpt_bytes": nbytes,
                "steps_per_mode": len(t_on),
            }
            Path(out).write_text(json.dumps(result))
    finally:
        cleanup()


def _table(r: dict[str, Any], a: Args) -> str:
    comm_ratio = r["ddp_aligned_MBps"] / r["raw_allreduce_MBps"]
    wait_ratio = r["ddp_comm_MBps"] / r["raw_allreduce_MBps"]
    overhead = r["overhead_paired"]
    ck_ratio = r["ckpt_MBps"] / r["raw_write_MBps"]
    ok = {
        "comm": comm_ratio >= TARGETS["comm_ratio"],
        "metrics": overhead <= TARGETS["metrics_overhead"],
        "ckpt": ck_ratio >= TARGETS["checkpoint_ratio"],
    }

    def verdict(key: str) -> str:
        return "met" if ok[key] else "MISSED"

    lines = [
        f"2 gloo processes, 1 thread each; MLP {r['params'] / 1e6:.2f} M params, "
        f"{r['grad_bytes'] / MB:.1f} MB of fp32 gradients in {len(r['buckets'])} buckets "
        f"(bucketCapMB {a.bucket_mb}), global batch {a.batch}; medians of {r['steps_per_mode']} steps per side "
        f"(on/off/plain alternating step by step), {a.ckpt_repeats} checkpoint writes",
        "",
        "| measurement | disttrain | reference | ratio | target | |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| (a) gradient all-reduce throughput, from the last rank's hook call | {r['ddp_aligned_MBps']:.0f} MB/s "
        f"inside a DDP step ({r['ddp_aligned_ms']:.1f} ms/step) | {r['raw_allreduce_MBps']:.0f} MB/s raw "
        f"all_reduce, same buckets, ranks aligned by a barrier ({r['raw_allreduce_ms']:.1f} ms) "
        f"| {comm_ratio:.2f} | >= 0.8 | {verdict('comm')} |",
        f"| (a-wait) same, counted from this rank's hook call = the trainer's comm metric (waiting for "
        f"the slower rank included) | {r['ddp_comm_MBps']:.0f} MB/s ({r['ddp_comm_ms']:.1f} ms/step) "
        f"| {r['raw_allreduce_MBps']:.0f} MB/s | {wait_ratio:.2f} | (diagnostic) | |",
        f"| (a') same, vs all_reduce after backward in a plain loop (rank skew included) "
        f"| {r['ddp_comm_MBps']:.0f} MB/s | {r['loop_allreduce_MBps']:.0f} MB/s "
        f"({r['loop_allreduce_ms']:.1f} ms) | {r['ddp_comm_MBps'] / r['loop_allreduce_MBps']:.2f} "
        "| (diagnostic) | |",
        f"| (b) step time, metrics on vs off | {r['step_on_ms']:.2f} ms | {r['step_off_ms']:.2f} ms "
        f"| {overhead * 100:+.1f}% (median of per-step pairs) | <= +3% | {verdict('metrics')} |",
        f"| (b') metrics bookkeeping per step, timed directly | {r['bookkeeping_us']:.0f} us "
        f"| {r['step_off_ms']:.2f} ms step | {r['bookkeeping_us'] / 1e3 / r['step_off_ms'] * 100:+.2f}% "
        "| (diagnostic) | |",
        f"| (c) checkpoint write ({r['ckpt_bytes'] / MB:.1f} MB) | {r['ckpt_MBps']:.0f} MB/s checkpoint.save "
        f"| {r['raw_write_MBps']:.0f} MB/s raw write + fsync | {ck_ratio:.2f} | >= 0.5 | {verdict('ckpt')} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument(
        "--bucket-mb", type=float, default=25.0, help="DDP bucketCapMB (the API default: 25)"
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="measured steps per round")
    p.add_argument(
        "--rounds", type=int, default=8, help="rounds: steps x rounds steps measured per side"
    )
    p.add_argument("--ckpt-repeats", type=int, default=5)
    p.add_argument(
        "--log-interval",
        type=int,
        default=10,
        help="JSON-lines record every N steps, as logIntervalSteps",
    )
    p.add_argument(
        "--dir", default=None, help="work dir (checkpoints, raw writes); default: a temp dir"
    )
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="disttrain-bench-", dir=ns.dir) as work:
        a = Args(hidden=ns.hidden, layers=ns.layers, batch=ns.batch, bucket_mb=ns.bucket_mb, warmup=ns.warmup,
                 steps=ns.steps, rounds=ns.rounds, ckpt_repeats=ns.ckpt_repeats, log_interval=ns.log_interval,
                 workdir=work)  # fmt: skip
        out = os.path.join(work, "result.json")
        mp.start_processes(
            _worker,
            args=(a, _free_port(), [_free_port() for _ in range(WORLD)], out),
            nprocs=WORLD,
            start_method="spawn",
        )
        result = json.loads(Path(out).read_text())
    print(_table(result, a))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    missed = (
        result["ddp_aligned_MBps"] / result["raw_allreduce_MBps"] < TARGETS["comm_ratio"]
        or result["overhead_paired"] > TARGETS["metrics_overhead"]
        or result["ckpt_MBps"] / result["raw_write_MBps"] < TARGETS["checkpoint_ratio"]
    )
    return 1 if ns.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
