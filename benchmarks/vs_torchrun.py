"""disttrain's trainer vs the plain torchrun + DDP loop a user would write, same work, 2 processes.

Both sides train the same MLP (the trainer's architecture: Linear+ReLU stem, hidden
blocks of Linear+ReLU+Dropout(0), a linear head) on scikit-learn's digits with the
same global batch, SGD with momentum, the same warmup + cosine learning rate, one
compute thread per process, gloo on CPU:

  plain:     `python -m torch.distributed.run --nproc-per-node 2 vs_torchrun.py --plain ...`
             runs `plain_worker` below: tensors in memory, a seeded permutation per epoch,
             DDP as it comes, torch's default SGD, the loss read once per log interval
             (`--plain-optimizer fused`: torch's fused SGD kernel, which the trainer takes on a CPU).
  disttrain: `python -m disttrain_trainer` x 2 with the env contract `disttrain local` sets,
             started as `disttrain local` starts them (each rank in its own session, its
             output to a log file), metrics on (Prometheus registry, JSON lines every log
             interval), checkpoints at the end, evaluation at the end.

Loop throughput = global samples / wall time from the end of step `warmup` to the end of
step `steps - warmup`, on rank 0, the same window on both sides (startup, the final
checkpoint and evaluation excluded on both). Runs alternate plain/disttrain per round so
load drift hits both alike; every round prints both and the ratio. Each run also reports the
CPU time its ranks spent per step inside the window (user + system, both ranks, read from
/proc while it runs): on 2 cores both sides keep the cores about 70% busy, so a side that needs
more CPU per step is mostly slower, and this figure shows it with less noise than the throughput
(the rest of a step is wake-up latency between the ranks' and gloo's threads).

    .venv/bin/python benchmarks/vs_torchrun.py [--rounds 5] [--json out.json] [--plain-optimizer fused]

`--per-step` measures instead what a user sees per step: each side trains two run lengths and
per-step time = (T(N2) - T(N1)) / (N2 - N1) (LENGTHS), so fixed costs inside the loop cancel on
both sides; rounds alternate the sides and the median of plain / disttrain is compared with
PER_STEP_TARGETS.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loop_ablation import CONTROL, FEATURES
from proc_stats import children, cpu_seconds

TARGET = 0.97
ABLATION = Path(__file__).with_name("loop_ablation.py")
WORLD = 2


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    hidden: int
    layers: int
    steps: int
    warmup: int  # also the log interval of both sides
    world: int = WORLD  # processes of each side (`--world 1`: the loops' host cost with no peer to wait for)


CASES = (
    # 4800 timed steps (about 10 s): on this class of machine the throughput of 1000 steps
    # varies by +-15% from one run to the next.
    Case(name="digits MLP 128x2", hidden=128, layers=2, steps=5000, warmup=100),
    Case(name="MLP 1024x4", hidden=1024, layers=4, steps=240, warmup=20),
)
BATCH = 128
LR, MOMENTUM, WEIGHT_DECAY, WARMUP_LR_STEPS = 0.1, 0.9, 1e-4, 30


# ---------------------------------------------------------------- the user's script


def plain_worker(hidden: int, layers: int, steps: int, warmup: int, out: str, fused: bool = False) -> None:
    """A plain torchrun + DDP training loop, written as a user would write it (`fused`: with
    torch's fused SGD kernel, as disttrain's trainer takes it on a CPU)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    xtr, _, ytr, _ = train_test_split(x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    X = torch.tensor(xtr, dtype=torch.float32)
    Y = torch.tensor(ytr, dtype=torch.int64)

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.0))

    model = nn.Sequential(
        nn.Sequential(nn.Linear(64, hidden), nn.ReLU()),
        nn.Sequential(*(block() for _ in range(layers - 1))),
        nn.Linear(hidden, 10),
    )
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                          **({"fused": True} if fused else {}))  # fmt: skip

    def lr_lambda(step: int) -> float:
        if step < WARMUP_LR_STEPS:
            return 1.0 / WARMUP_LR_STEPS + (1 - 1.0 / WARMUP_LR_STEPS) * step / WARMUP_LR_STEPS
        progress = (step - WARMUP_LR_STEPS) / max(1, steps - WARMUP_LR_STEPS)
        return 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    per_rank = BATCH // world
    n_batches = len(X) // BATCH
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(X), generator=g)
    marks: dict[int, float] = {0: time.time()}  # 0: the loop starts (the two-length method's T(N))
    for step in range(1, steps + 1):
        i = (step - 1) % n_batches
        if i == 0 and step > 1:
            perm = torch.randperm(len(X), generator=g)
        idx = perm[i * BATCH + rank * per_rank : i * BATCH + (rank + 1) * per_rank]
        xb, yb = X[idx], Y[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        if step % warmup == 0:
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            marks[step] = time.time()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(os.path.dirname(out), "plain-final.pt"))
        Path(out).write_text(json.dumps({"marks": marks}))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the two sides


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, kw_only=True)
class Measured:
    samples_per_s: float
    cpu_us_per_step: float | None  # user + system of all ranks per step in the window


def _window(marks: dict[int, float], case: Case, cpu: list[tuple[float, float]]) -> Measured:
    first, last = case.warmup, case.steps - case.warmup
    t0, t1 = marks[first], marks[last]
    inside = [(t, c) for t, c in cpu if t0 <= t <= t1]
    per_step = None
    if len(inside) >= 2:
        (ta, ca), (tb, cb) = inside[0], inside[-1]
        steps = _step_at(marks, tb) - _step_at(marks, ta)
        per_step = (cb - ca) / steps * 1e6 if steps > 0 else None
    return Measured(samples_per_s=(last - first) * BATCH / (t1 - t0), cpu_us_per_step=per_step)


def _step_at(marks: dict[int, float], t: float) -> float:
    """The (fractional) step the loop was at at time t, between two marks."""
    pts = sorted(marks.items())
    for (sa, ta), (sb, tb) in zip(pts, pts[1:], strict=False):
        if ta <= t <= tb:
            return sa + (sb - sa) * (t - ta) / (tb - ta)
    raise ValueError(f"time {t} is outside the marks")


def _cpu_seconds(pid: int) -> float:
    """0 once the process is gone: after the timed window, which is all that is read."""
    try:
        return cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


class CpuSampler:
    """Samples the CPU time of the ranks every 0.25 s while a run goes on: (wall time, seconds).
    `ranks` returns the rank pids (torchrun's children are found once they exist)."""

    def __init__(self, ranks: Any, expect: int) -> None:
        self.samples: list[tuple[float, float]] = []
        self._ranks, self.expect, self._stop = ranks, expect, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            pids = self._ranks()
            if len(pids) == self.expect:
                self.samples.append((time.time(), sum(_cpu_seconds(p) for p in pids)))


def run_plain(case: Case, work: Path, *, fused: bool = False) -> Measured:
    out = work / "plain.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={case.world}",
           f"--master-port={_free_port()}", __file__, "--plain", str(case.hidden), str(case.layers),
           str(case.steps), str(case.warmup), str(out), *(["--fused"] if fused else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out.unlink(missing_ok=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with CpuSampler(lambda: children(proc.pid), case.world) as cpu:
        stdout, stderr = proc.communicate()
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    # The plain script may abort in destroy_process_group (gloo, "terminate called without an
    # active exception"): after its timed loop, and rank 0 has written its marks by then. A run
    # without its marks failed for real.
    if not out.exists():
        raise RuntimeError(f"plain torchrun run failed (exit {done.returncode}):\n{done.stdout[-2000:]}"
                           f"{done.stderr[-4000:]}")
    if done.returncode:
        print(f"  (plain run exited {done.returncode} after writing its marks: "
              f"{(done.stderr.strip().splitlines() or [''])[0][:120]})", flush=True)
    marks = {int(k): v for k, v in json.loads(out.read_text())["marks"].items()}
    return _window(marks, case, cpu.samples)


def _spec(case: Case) -> dict[str, Any]:
    return {
        "mode": "data",
        "workers": {"replicas": case.world},
        "model": {"name": "mlp", "hidden": case.hidden, "layers": case.layers, "dropout": 0.0},
        "data": {"name": "digits", "batchSize": BATCH, "seed": 0},
        "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM, "weightDecay": WEIGHT_DECAY,
                      "scaleLR": "linear", "baseBatchSize": BATCH, "warmupSteps": WARMUP_LR_STEPS,
                      "decay": "cosine"},
        "training": {"steps": case.steps, "logIntervalSteps": case.warmup},
        "checkpoint": {"intervalSteps": case.steps, "keep": 1},
    }  # fmt: skip


def run_disttrain(case: Case, work: Path, tag: str) -> Measured:
    run_dir, cpu = run_ranks(case, work, tag)
    recs = [json.loads(x) for x in (run_dir / "metrics-rank0.jsonl").read_text().splitlines()]
    marks = {int(r["step"]): float(r["time"]) for r in recs if "event" not in r}
    return _window(marks, case, cpu)


def run_ranks(case: Case, work: Path, tag: str, *, off: str | None = None) -> tuple[Path, list[tuple[float, float]]]:
    """Both ranks as `disttrain local` starts them -> the run dir and the CPU samples; `off`: a
    feature of the loop switched off (loop_ablation.py)."""
    from disttrain_api import constants as C
    from disttrain_api.model import parse_spec, to_json

    job = f"bench-{tag}"
    config = work / f"{job}.json"
    config.write_text(json.dumps(to_json(parse_spec(_spec(case)))))
    run_dir = work / "runs" / job
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    world = case.world
    logs = [work / f"{job}-rank{rank}.log" for rank in range(world)]
    for rank in range(world):
        env = {
            **os.environ,
            C.ENV_CONFIG: str(config), C.ENV_WORLD_SIZE: str(world), C.ENV_RANK: str(rank),
            C.ENV_LOCAL_RANK: str(rank), C.ENV_NODE_RANK: "0", C.ENV_NPROC_PER_NODE: str(world),
            C.ENV_MASTER_ADDR: "127.0.0.1", C.ENV_MASTER_PORT: str(port), C.ENV_JOB: job,
            C.ENV_CHECKPOINT_DIR: str(work / "ckpt"), C.ENV_RUN_DIR: str(run_dir), C.ENV_METRICS_PORT: "0",
            C.ENV_DATA_CACHE: str(work / "data"), "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        with logs[rank].open("wb") as log:  # as launcher/gang.py starts a rank
            argv = [sys.executable, "-m", "disttrain_trainer"] if off is None else [sys.executable, str(ABLATION), off]
            procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
    try:
        with CpuSampler(lambda: [p.pid for p in procs], world) as cpu:
            for p in procs:
                p.wait()
    finally:  # in their own sessions the ranks do not get the benchmark's Ctrl-C
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError("disttrain trainer failed:\n" + "\n".join(x.read_text()[-2000:] for x in logs))
    return run_dir, cpu.samples


# The two-run-length method: each side trains N1 and N2 steps; per-step time = (T(N2) - T(N1)) /
# (N2 - N1), T being the whole training loop on rank 0 (the trainer's trainS; the plain loop from
# before its first step to after its last), so what the loop pays once (the first step waiting for
# the other rank, the first interval's allocations, the final log) cancels on both sides.
LENGTHS = {"digits": (500, 2500), "MLP": (100, 300)}


def plain_loop_s(case: Case, work: Path, *, fused: bool) -> float:
    run_plain(case, work, fused=fused)
    marks = {int(k): v for k, v in json.loads((work / "plain.json").read_text())["marks"].items()}
    return marks[case.steps] - marks[0]


def disttrain_loop_s(case: Case, work: Path, tag: str, *, off: str | None = None) -> float:
    from disttrain_api.constants import SUMMARY_FILENAME

    run_dir, _ = run_ranks(case, work, tag, off=off)
    return float(json.loads((run_dir / SUMMARY_FILENAME).read_text())["trainS"])


def per_step_rounds(case: Case, work: Path, rounds: int, *, fused: bool,
                    ablate: tuple[str, ...] = ()) -> list[dict[str, float]]:  # fmt: skip
    """Per-step seconds of both sides from two run lengths, the sides alternating (shuffled, seeded, with ablations);
    `ablate`: also the trainer with each of these loop features off (key "off:FEATURE")."""
    n1, n2 = LENGTHS[case.name.split()[0]]
    sides = ["plain", "disttrain", *(f"off:{f}" for f in (*ablate, CONTROL) if ablate)]
    rows = []
    for r in range(rounds):
        # With ablations a fixed rotation would keep every side's place relative to the trainer's
        # run: a drift within a round would then favour the same features every time.
        order = random.Random(r).sample(sides, len(sides)) if ablate else sides if r % 2 == 0 else sides[::-1]
        got: dict[str, float] = {}
        for side in order:
            t = {}
            for n in (n1, n2):
                c = dataclasses.replace(case, steps=n)
                if side == "plain":
                    t[n] = plain_loop_s(c, work, fused=fused)
                else:
                    off = side.removeprefix("off:") if side.startswith("off:") else None
                    tag = f"{case.hidden}x{case.layers}-{r}-{n}-{off or 'full'}"
                    t[n] = disttrain_loop_s(c, work, tag, off=off)
            got[side] = (t[n2] - t[n1]) / (n2 - n1)
        rows.append({**got, "ratio": got["plain"] / got["disttrain"], "load": os.getloadavg()[0]})
        offs = "".join(f", {s} {got[s] * 1e6:.0f} us" for s in sides[2:])
        print(f"{case.name} round {r + 1} (N = {n1} / {n2}): per step plain {got['plain'] * 1e6:.0f} us, "
              f"disttrain {got['disttrain'] * 1e6:.0f} us{offs}, plain / disttrain {rows[-1]['ratio']:.3f} "
              f"(load {rows[-1]['load']:.1f})", flush=True)  # fmt: skip
    return rows


def print_ablation(results: dict[str, list[dict[str, float]]], ablate: tuple[str, ...]) -> None:
    """Per feature: the trainer's per-step time with it off, what switching it off saved (medians of
    the per-round differences, each round's sides measured minutes apart at most), and that saving's
    share of the gap to the plain loop (median disttrain - plain; none when the trainer is not slower)."""
    print("| model | feature off | us per step (median) | saved us per step (median; rounds) | share of the gap |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        full = statistics.median(r["disttrain"] for r in rows) * 1e6
        gap = statistics.median(r["disttrain"] - r["plain"] for r in rows) * 1e6
        print(f"| {name} | (none: the trainer) | {full:.0f} | | gap to plain {gap:+.0f} us |")
        print(f"| {name} | (the plain loop) | {statistics.median(r['plain'] for r in rows) * 1e6:.0f} | | |")
        for f in (*ablate, CONTROL):
            saved = [(r["disttrain"] - r[f"off:{f}"]) * 1e6 for r in rows]
            med = statistics.median(saved)
            share = f"{med / gap:.0%}" if gap > 0 else "n/a (no gap)"
            label = f"{CONTROL} (the control: nothing off, started like the others)" if f == CONTROL else f
            print(f"| {name} | {label} | {statistics.median(r[f'off:{f}'] for r in rows) * 1e6:.0f} | {med:+.0f} "
                  f"({', '.join(f'{v:+.0f}' for v in saved)}) | {share} |")  # fmt: skip


def print_per_step(results: dict[str, list[dict[str, float]]], targets: dict[str, float]) -> None:
    print("| model | N1 / N2 | round | plain (us/step) | disttrain (us/step) | plain / disttrain | load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        n1, n2 = LENGTHS[name.split()[0]]
        for i, row in enumerate(rows):
            print(f"| {name} | {n1} / {n2} | {i + 1} | {row['plain'] * 1e6:.0f} | {row['disttrain'] * 1e6:.0f} "
                  f"| {row['ratio']:.3f} | {row['load']:.1f} |")  # fmt: skip
        med = statistics.median(r["ratio"] for r in rows)
        target = targets[name.split()[0]]
        print(f"| {name} | | median | | | **{med:.3f}** | target >= {target}: {'met' if med >= target else 'MISSED'} |")


PER_STEP_TARGETS = {"digits": 0.97, "MLP": 0.98}


def _us(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} us"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # re-invoked by torchrun as the user's script
        h, layers, steps, warmup, out = argv[1:6]
        plain_worker(int(h), int(layers), int(steps), int(warmup), out, fused="--fused" in argv[6:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--plain-optimizer", choices=("default", "fused"), default="default",
                   help="the plain script's SGD: torch's default (a per-parameter loop on a CPU, what a "
                        "script gets unless it asks) or its fused kernel (what disttrain's trainer takes)")
    p.add_argument("--case", action="append", choices=sorted({c.name.split()[0] for c in CASES}),
                   help="only the case(s) whose name starts with this (default: both)")
    p.add_argument("--per-step", action="store_true",
                   help="per-step time of both sides from two run lengths (fixed costs cancel) instead of "
                        "the throughput over one run's window")
    p.add_argument("--world", type=int, default=WORLD,
                   help="processes per side (with --per-step; 1: each loop's host cost, no peer to wait for)")
    p.add_argument("--ablate", nargs="*", choices=FEATURES, default=None, metavar="FEATURE",
                   help="with --per-step: also the trainer with each loop feature off, one at a time "
                        f"(loop_ablation.py; none given: all of {', '.join(FEATURES)})")
    ns = p.parse_args(argv)
    ablate = () if ns.ablate is None else tuple(ns.ablate) or FEATURES
    if ablate and not ns.per_step:
        p.error("--ablate needs --per-step")
    if ns.world != WORLD and not ns.per_step:
        p.error("--world needs --per-step")
    cases = [dataclasses.replace(c, world=ns.world) for c in CASES if not ns.case or c.name.split()[0] in ns.case]
    results: dict[str, Any] = {"load_before": os.getloadavg(), "plain_optimizer": ns.plain_optimizer, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="disttrain-vs-torchrun-") as tmp:
        work = Path(tmp)
        # Pack the digits shards once, outside the timed runs.
        run_disttrain(Case(name="warm", hidden=8, layers=1, steps=4, warmup=1), work, "warm")
        if ns.per_step:
            for case in cases:
                results["cases"][case.name] = per_step_rounds(case, work, ns.rounds,
                                                              fused=ns.plain_optimizer == "fused", ablate=ablate)
            print(f"\nper-step time from two run lengths; global batch {BATCH}; {ns.world} gloo processes, 1 thread "
                  f"each; load average before {results['load_before'][0]:.1f}, after {os.getloadavg()[0]:.1f}; "
                  f"the plain script's SGD: {ns.plain_optimizer}\n")  # fmt: skip
            print_per_step(results["cases"], PER_STEP_TARGETS)
            if ablate:
                print()
                print_ablation(results["cases"], ablate)
            if ns.json:
                Path(ns.json).write_text(json.dumps(results, indent=2) + "\n")
            return 0
        for case in cases:
            rows = []
            for r in range(ns.rounds):
                order = ("plain", "disttrain") if r % 2 == 0 else ("disttrain", "plain")
                got: dict[str, Measured] = {}
                for side in order:
                    got[side] = (run_plain(case, work, fused=ns.plain_optimizer == "fused") if side == "plain"
                                 else run_disttrain(case, work, f"{case.hidden}x{case.layers}-{r}"))  # fmt: skip
                row = {side: m.samples_per_s for side, m in got.items()}
                row |= {f"{side}_cpu_us_per_step": m.cpu_us_per_step for side, m in got.items()}
                rows.append({**row, "ratio": row["disttrain"] / row["plain"], "load": os.getloadavg()[0]})
                print(f"{case.name} round {r + 1}: plain {row['plain']:.0f} samples/s, disttrain "
                      f"{row['disttrain']:.0f} samples/s, ratio {rows[-1]['ratio']:.3f}; CPU per step "
                      f"{_us(row['plain_cpu_us_per_step'])} vs {_us(row['disttrain_cpu_us_per_step'])} "
                      f"(load {rows[-1]['load']:.1f})", flush=True)  # fmt: skip
            results["cases"][case.name] = rows
    results["load_after"] = os.getloadavg()
    print()
    print(f"steps {', '.join(f'{c.name}: {c.steps} (window {c.warmup}..{c.steps - c.warmup})' for c in CASES)}; "
          f"global batch {BATCH}; {WORLD} gloo processes, 1 thread each; load average before "
          f"{results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f}; the plain script's SGD: "
          f"{ns.plain_optimizer}")  # fmt: skip
    print()
    print("| model | round | plain torchrun + DDP (samples/s) | disttrain (samples/s) | ratio "
          "| CPU per step, plain / disttrain (both ranks) | load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, rows in results["cases"].items():
        for i, row in enumerate(rows):
            print(f"| {name} | {i + 1} | {row['plain']:.0f} | {row['disttrain']:.0f} | {row['ratio']:.3f} "
                  f"| {_us(row['plain_cpu_us_per_step'])} / {_us(row['disttrain_cpu_us_per_step'])} "
                  f"| {row['load']:.1f} |")  # fmt: skip
        med = statistics.median(r["ratio"] for r in rows)
        verdict = "met" if med >= TARGET else "MISSED"
        cpu = [r["disttrain_cpu_us_per_step"] / r["plain_cpu_us_per_step"] for r in rows
               if r["plain_cpu_us_per_step"] and r["disttrain_cpu_us_per_step"]]  # fmt: skip
        cpu_ratio = f"CPU per step disttrain/plain {statistics.median(cpu):.3f}" if cpu else ""
        print(f"| {name} | median | | | {med:.3f} | {cpu_ratio} | target >= {TARGET}: {verdict} |")
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
