"""Pipeline schedules side by side: measured bubble vs theory, step time, activation memory.

One run, real gloo processes on this machine, identical blocks (so stages are
balanced and GPipe's theory applies):
  1. bubble fraction of GPipe and 1F1B for p stages and m micro-batches, measured
     from every stage's compute timeline (stage_times.split_idle), against
     (p - 1) / (m + p - 1);
  2. step time of every schedule on the same model and batch;
  3. peak activation bytes held per stage, GPipe vs 1F1B (measured by the stages'
     saved-tensor hooks).

    .venv/bin/python benchmarks/pipeline.py                # p = 2
    .venv/bin/python benchmarks/pipeline.py --stages 2 4   # and p = 4 (4 processes: on 2 cores every
                                                           # stage runs at half speed while all are busy)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from disttrain_trainer.modes.pipeline.partition import Plan, uniform_bounds  # noqa: E402
from disttrain_trainer.modes.pipeline.pipedream import PipeDreamStage  # noqa: E402
from disttrain_trainer.modes.pipeline.schedules import Pipeline, total_stages  # noqa: E402
from disttrain_trainer.modes.pipeline.stage_times import split_idle, theory_bubble  # noqa: E402

WARMUP, STEPS = 2, 10


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The benchmark model: `blocks_per_stage` blocks Linear(width)+Tanh per stage, on `batch` rows."""

    width: int = 1024
    blocks_per_stage: int = 2
    batch: int = 1024


def _blocks(n: int, shape: Shape) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(shape.width, shape.width), nn.Tanh()) for _ in range(n)]


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


def _measure(rank: int, world: int, schedule: str, m: int, shape: Shape) -> dict[str, Any]:
    virtual = 2 if schedule in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble") else 1
    n = total_stages(schedule, world, virtual)
    blocks = _blocks(n * shape.blocks_per_stage // virtual, shape)
    bounds = uniform_bounds(len(blocks), n)
    plan = Plan(method="uniform", bounds=bounds, stage_seconds=tuple(0.0 for _ in bounds))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(shape.batch, shape.width, generator=g), torch.randn(shape.batch, shape.width, generator=g)
    # The input asks for its gradient so the first stage's backward does the same work as the
    # others (it would otherwise skip the input gradient of its first Linear and be the lighter
    # stage, an imbalance that GPipe's formula for equal stages does not model).
    x.requires_grad_(True)
    if schedule == "PipeDream":
        mod = nn.Sequential(*(blocks[k] for k in plan.blocks_of(rank)))
        engine: Any = PipeDreamStage(module=mod, stage=rank, stages=world, loss_fn=_loss, device=torch.device("cpu"),
                                     optimizer=torch.optim.SGD(mod.parameters(), lr=1e-4))  # fmt: skip

        def step() -> Any:
            return engine.step(list(x.chunk(m)), list(y.chunk(m)), m)
    else:
        engine = Pipeline(blocks, plan, schedule=schedule, microbatches=m, virtual=virtual, pp_rank=rank,
                          pp_size=world, group=None, device=torch.device("cpu"), loss_fn=_loss)  # fmt: skip

        def step() -> Any:
            for p in engine.parameters():
                p.grad = None
            return engine.step(x, y)

    bubbles, p2ps, times, peak = [], [], [], 0
    for i in range(WARMUP + STEPS):
        dist.barrier()
        t0 = time.perf_counter()
        out = step()
        dt = time.perf_counter() - t0
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, out.intervals)
        if i >= WARMUP:
            st = split_idle(out.intervals, everyone, n)
            bubbles.append(st.bubble_fraction)
            p2ps.append(st.p2p_s / st.window_s if st.window_s else 0.0)
            times.append(dt)
            peak = max(peak, out.act_peak_bytes)
    return {"bubble": statistics.mean(bubbles), "bubble_median": statistics.median(bubbles),
            "p2p": statistics.mean(p2ps), "step_s": statistics.median(times),
            "peak": peak}  # fmt: skip


def _worker(rank: int, world: int, port: int, cases: list[tuple[str, int]], shape: Shape, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = []
    for schedule, m in cases:
        r = _measure(rank, world, schedule, m, shape)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, r)
        results.append({"schedule": schedule, "m": m, "per_stage": gathered})
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(world: int, cases: list[tuple[str, int]], shape: Shape) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        mp.start_processes(_worker, args=(world, _free_port(), cases, shape, out), nprocs=world,
                           start_method="spawn")
        return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, nargs="+", default=[2])
    ap.add_argument("--width", type=int, default=Shape.width, help="block width (Linear(width)+Tanh)")
    ap.add_argument("--blocks-per-stage", type=int, default=Shape.blocks_per_stage)
    ap.add_argument("--batch", type=int, default=Shape.batch, help="global batch, split into m micro-batches")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args()
    shape = Shape(width=args.width, blocks_per_stage=args.blocks_per_stage, batch=args.batch)
    report: dict[str, Any] = {"shape": asdict(shape), "load_before": os.getloadavg(), "bubble": [], "schedules": []}
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}, {os.cpu_count()} cores,"
          f" torch {torch.__version__}; blocks Linear({shape.width})+Tanh, {shape.blocks_per_stage} per stage, "
          f"batch {shape.batch}")
    print("\n| p | m | schedule | bubble measured (mean of steps) | (median step) | theory (p-1)/(m+p-1) "
          "| mean / theory | p2p fraction | step ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in args.stages:
        ms = sorted({1, 2, 4, 8, 4 * p})  # the target is stated for m >= 4p
        cases = [("Naive", 1)] + [(s, m) for s in ("GPipe", "1F1B") for m in ms if s == "GPipe" or m >= p]
        for r in run(p, cases, shape):
            stages = r["per_stage"]
            bubble = statistics.mean(s["bubble"] for s in stages)
            median = statistics.mean(s["bubble_median"] for s in stages)
            p2p = statistics.mean(s["p2p"] for s in stages)
            step = max(s["step_s"] for s in stages)
            m = 1 if r["schedule"] == "Naive" else r["m"]
            theory = theory_bubble(p, m)
            report["bubble"].append({"p": p, "m": m, "schedule": r["schedule"], "bubble": bubble,
                                     "bubble_median_step": median, "theory": theory, "p2p": p2p,
                                     "step_s": step})  # fmt: skip
            print(f"| {p} | {m} | {r['schedule']} | {bubble:.3f} | {median:.3f} | {theory:.3f} | "
                  f"{bubble / theory:.2f} | {p2p:.3f} | {step * 1e3:.1f} |")
    p, m = 2, 8
    print(f"\n| schedule (p={p}, m={m}) | step ms | bubble | peak activation bytes per stage |")
    print("|---|---|---|---|")
    schedules = ["Naive", "GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "PipeDream"]
    for r in run(p, [(s, m) for s in schedules], shape):
        stages = r["per_stage"]
        step = max(s["step_s"] for s in stages)
        bubble = statistics.mean(s["bubble"] for s in stages)
        report["schedules"].append({"schedule": r["schedule"], "step_s": step, "bubble": bubble,
                                    "peak_bytes": [s["peak"] for s in stages]})  # fmt: skip
        peaks = ", ".join(f"{s['peak'] / 2**20:.1f} MiB" for s in stages)
        print(f"| {r['schedule']} | {step * 1e3:.1f} | {bubble:.3f} | {peaks} |")
    report["load_after"] = os.getloadavg()
    print(f"\nload average before {report['load_before'][0]:.1f}, after {report['load_after'][0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
