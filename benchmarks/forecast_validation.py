"""Does `disttrain explain` predict what it did not see? Forecast world 4 from world-1 and world-2 runs.

For each case the example manifest is run with `disttrain local` at world sizes 1, 2 and 4
with the same per-replica batch (weak scaling), evaluation off and no checkpoint inside the
loop, every rank one compute thread (OMP_NUM_THREADS=1). The forecast (disttrain_api.scaling,
exactly what `disttrain explain RUN_DIR_2 RUN_DIR_1` computes) predicts the world-4 step of
the case's layout from the world-2 run (and the world-1 run's unsplit compute); the world-4
run measures it. Both are steady-state means (the summary's scaling.perStep: the first log
interval left out). Printed side by side, with the error; and a second forecast that also
has this host's all-reduce measured with 4 ranks (`disttrain explain --probe-host`: 4 gloo
processes, no training), which a 2-rank run cannot show.

  case            world 1              world 2                   world 4
  data            mode data, 1 rank    data, dp 2                data, dp 4
  data+powersgd   the same, PowerSGD   data, dp 2, PowerSGD      data, dp 4, PowerSGD
  pipeline        mode data, 1 rank    pipeline, 2 stages 1F1B   pipeline, 4 stages 1F1B
  tensor          mode data, 1 rank    tensor 2                  tensor 4

On one host of 2 cores, world 4 time-shares the cores (4 single-threaded ranks): the
forecast's contention term (ranks x threads / cores) must carry that, and gloo's "link" is
memory copies by the same cores. See benchmarks/README.md for what this shows and what not.

    .venv/bin/python benchmarks/forecast_validation.py [--cases data tensor] [--steps N] [--batch B] [--keep DIR] [--rounds K]
    .venv/bin/python benchmarks/forecast_validation.py --keep DIR --rounds K --repredict   # the same runs, the current model
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from disttrain_api.scaling import Layout, Link, forecast, measured_from_summary
from disttrain_api.scaling.model import step_time
from disttrain_trainer.launcher.link_probe import probe_host

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "manifests" / "examples"
TARGET = 4
TOLERANCE = 0.15

# case -> example, per-replica batch, training steps (the first 10 are warm-up), the layout predicted at world 4
CASES: dict[str, dict[str, Any]] = {
    "data": {"example": "data-parallel.yaml", "batch": 128, "steps": 300, "layout": Layout(dp=TARGET)},
    "data+powersgd": {"example": "data-parallel.yaml", "batch": 128, "steps": 300, "compression": "powersgd",
                      "layout": Layout(dp=TARGET, compression="powersgd")},
    "pipeline": {"example": "pipeline.yaml", "batch": 64, "steps": 80, "layout": Layout(pp=TARGET)},
    "tensor": {"example": "tensor.yaml", "batch": 32, "steps": 60, "layout": Layout(tp=TARGET)},
}  # fmt: skip


def manifest(case: str, world: int, steps: int) -> dict[str, Any]:
    """The case's example at `world` ranks, same per-replica batch, no evaluation or checkpoint in the loop."""
    spec_case = CASES[case]
    doc = yaml.safe_load((EXAMPLES / spec_case["example"]).read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = f"fv-{case.replace('+', '-')}-w{world}"
    spec = doc["spec"]
    batch = spec_case["batch"]
    spec["training"] = {**spec.get("training", {}), "steps": steps, "evalIntervalSteps": 0, "logIntervalSteps": 10}
    spec["checkpoint"] = {"intervalSteps": steps * 10, "keep": 1}
    if spec_case.get("compression"):
        spec["training"]["gradientCompression"] = spec_case["compression"]
    mode = spec["mode"]
    par = spec.setdefault("parallelism", {})
    if world == 1 or mode == "data":  # one replica per rank
        spec["mode"] = "data"
        spec["workers"] = {**spec["workers"], "replicas": world, "procsPerWorker": 1}
        spec["parallelism"] = {}
        spec["data"]["batchSize"] = batch * world
    elif mode == "pipeline":  # one replica of `world` stages
        par["pipeline"] = world
        spec["workers"] = {**spec["workers"], "replicas": world, "procsPerWorker": 1}
        spec["data"]["batchSize"] = batch
    elif mode == "tensor":  # one replica split `world` ways, in one pod
        par["tensor"] = world
        spec["workers"] = {**spec["workers"], "replicas": 1, "procsPerWorker": world}
        spec["data"]["batchSize"] = batch
    return doc


def run(doc: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    path = run_dir.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "disttrain"), "local", str(path), "--run-dir", str(run_dir),
           "--fresh", "--no-progress", "--metrics-port", "0"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{path.name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def predict(case: str, one: dict[str, Any], two: dict[str, Any], host: Link | None = None) -> tuple[float, Any, float]:
    """World-4 step of the case's layout from the world-2 run and the world-1 run's compute
    (and, with `host`, this host's link measured with 4 ranks, as `--probe-host` does):
    (step seconds, its breakdown, the ring latency the forecast assumes at world 4)."""
    m2 = measured_from_summary(two, source="world 2")
    m1 = measured_from_summary(one, source="world 1")
    fc = forecast(m2, single=m1, sizes=(1, 2, TARGET), host_links={TARGET: host} if host else None)
    bd = step_time(fc.calibrated, CASES[case]["layout"], fc.topology, fc.placement)
    link = fc.topology.link_for(TARGET)
    return bd.step_s, bd, link.alpha_s * (1 if link.contended else fc.placement.contention(TARGET))


def kept_host_link(path: Path, *, rerun: bool) -> Link:
    """This host's ring at 4 ranks, measured without training (what --probe-host does) and kept
    beside the runs, or (with rerun False) the one kept there by an earlier run."""
    got = probe_host(TARGET) if rerun else json.loads(path.read_text())
    if rerun:
        path.write_text(json.dumps(got))
    return Link(alpha_s=got["alphaS"], beta_bytes_per_s=got["betaBytesPerS"], source="host", contended=True)


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def one_round(args: argparse.Namespace, where: Path) -> list[tuple[Any, ...]]:
    """World 1, 2 and 4 of every case under `where`, the forecasts, and their table; the rows."""
    rows = []
    for case in args.cases:
        got = {}
        for world in (1, 2, TARGET):
            doc = manifest(case, world, args.steps or CASES[case]["steps"])
            if args.repredict:
                got[world] = json.loads((where / doc["metadata"]["name"] / "summary.json").read_text())
                continue
            got[world] = run(doc, where / doc["metadata"]["name"])
            print(f"  {case} world {world}: step {got[world]['scaling']['perStep']['stepS'] * 1e3:.2f} ms "
                  f"(load {load()})", flush=True)  # fmt: skip
        pred, bd, alpha = predict(case, got[1], got[2])
        host = kept_host_link(where / f"host-link-{case.replace('+', '-')}.json", rerun=not args.repredict)
        pred_host, bd_host, _ = predict(case, got[1], got[2], host)
        meas = got[TARGET]["scaling"]["perStep"]["stepS"]
        rows.append((case, *(got[w]["scaling"]["perStep"]["stepS"] for w in (1, 2)), pred, pred_host, meas, bd, alpha,
                     host.alpha_s))  # fmt: skip
    print(f"\nload average {load()} at {time.strftime('%H:%M:%S', time.gmtime())} UTC")
    print("| case | world 1 step ms | world 2 step ms | world 4 measured ms | predicted from world 1+2 | error | "
          "predicted with --probe-host | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for case, s1, s2, pred, pred_host, meas, *_ in rows:
        err, err_host = pred / meas - 1, pred_host / meas - 1
        print(f"| {case} | {s1 * 1e3:.2f} | {s2 * 1e3:.2f} | {meas * 1e3:.2f} | {pred * 1e3:.2f} | {err:+.1%} | "
              f"{pred_host * 1e3:.2f} | {err_host:+.1%} |")  # fmt: skip
    print("\nThe forecast's world-4 step (from world 1+2) in parts, and the ring latency per message it assumed at")
    print("world 4 (the world-2 probe's x the contention) against this host's 4-rank probe:")
    print("| case | data ms | compute ms | exposed comm ms | bubble ms | latency assumed us | latency, 4-rank probe us |")
    print("|---|---|---|---|---|---|---|")
    for case, *_, bd, alpha, probed in rows:
        print(f"| {case} | {bd.data_s * 1e3:.2f} | {bd.compute_s * 1e3:.2f} | {bd.exposed_s * 1e3:.2f} | "
              f"{bd.bubble_s * 1e3:.2f} | {alpha * 1e6:.0f} | {probed * 1e6:.0f} |")  # fmt: skip
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--steps", type=int, default=None, help="training steps of every run (default: the case's)")
    ap.add_argument("--batch", type=int, default=None, help="per-replica batch of every case (default: the case's)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run dirs here (default: a temporary folder)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat everything, and print the median error per case")
    ap.add_argument("--repredict", action="store_true",
                    help="run nothing: forecast again from the runs and host probes kept under --keep")
    args = ap.parse_args()
    if args.repredict and not args.keep:
        ap.error("--repredict needs --keep DIR (the folder an earlier run kept)")
    if args.batch:
        for spec in CASES.values():
            spec["batch"] = args.batch
    root = args.keep or Path(tempfile.mkdtemp(prefix="forecast-validation-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"run dirs under {root}; load average {load()} at {time.strftime('%H:%M:%S', time.gmtime())} UTC",
          flush=True)  # fmt: skip
    errors: dict[str, list[tuple[float, float]]] = {case: [] for case in args.cases}
    for k in range(args.rounds):
        where = root / f"round-{k + 1}" if args.rounds > 1 else root
        where.mkdir(parents=True, exist_ok=True)
        if args.rounds > 1:
            print(f"round {k + 1} of {args.rounds}", flush=True)
        for case, _s1, _s2, pred, pred_host, meas, *_ in one_round(args, where):
            errors[case].append((pred / meas - 1, pred_host / meas - 1))
    if args.rounds > 1:
        print(f"\nmedian error over {args.rounds} rounds (each round: world 1, 2 and 4 runs of its own):")
        print("| case | errors from world 1+2 | median | errors with --probe-host | median |")
        print("|---|---|---|---|---|")
        for case, errs in errors.items():
            a, b = [e for e, _ in errs], [h for _, h in errs]
            print(f"| {case} | {', '.join(f'{e:+.1%}' for e in a)} | {statistics.median(a):+.1%} | "
                  f"{', '.join(f'{e:+.1%}' for e in b)} | {statistics.median(b):+.1%} |")  # fmt: skip
    ok = all(abs(statistics.median(e for e, _ in errs)) <= TOLERANCE for errs in errors.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
