"""Does `disttrain explain` predict what it did not see? Forecast world 4 from world-1 and world-2 runs.

For each case the example manifest is run with `disttrain local` at world sizes 1, 2 and 4
with the same per-replica batch (weak scaling), evaluation off and no checkpoint inside the
loop, every rank one compute thread (OMP_NUM_THREADS=1). The forecast (disttrain_api.scaling,
exactly what `disttrain explain RUN_DIR_2 RUN_DIR_1` computes) predicts the world-4 step of
the case's layout from the world-2 run (and the world-1 run's unsplit compute); the world-4
run measures it. Both are steady-state means (the summary's scaling.perStep: the first log
interval left out). Printed side by side, with the error.

  case            world 1              world 2                   world 4
  data            mode data, 1 rank    data, dp 2                data, dp 4
  data+powersgd   the same, PowerSGD   data, dp 2, PowerSGD      data, dp 4, PowerSGD
  pipeline        mode data, 1 rank    pipeline, 2 stages 1F1B   pipeline, 4 stages 1F1B
  tensor          mode data, 1 rank    tensor 2                  tensor 4

On one host of 2 cores, world 4 time-shares the cores (4 single-threaded ranks): the
forecast's contention term (ranks x threads / cores) must carry that, and gloo's "link" is
memory copies by the same cores. See benchmarks/README.md for what this shows and what not.

    .venv/bin/python benchmarks/forecast_validation.py [--steps 80] [--cases data tensor] [--keep DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from disttrain_api.scaling import Layout, forecast, measured_from_summary
from disttrain_api.scaling.model import step_time

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "manifests" / "examples"
TARGET = 4
TOLERANCE = 0.15

# case -> (example, per-replica batch, the layout predicted at world 4, overrides per world size)
CASES: dict[str, dict[str, Any]] = {
    "data": {"example": "data-parallel.yaml", "batch": 128, "layout": Layout(dp=TARGET)},
    "data+powersgd": {"example": "data-parallel.yaml", "batch": 128, "compression": "powersgd",
                      "layout": Layout(dp=TARGET, compression="powersgd")},
    "pipeline": {"example": "pipeline.yaml", "batch": 64, "layout": Layout(pp=TARGET)},
    "tensor": {"example": "tensor.yaml", "batch": 32, "layout": Layout(tp=TARGET)},
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


def predict(case: str, one: dict[str, Any], two: dict[str, Any]) -> float:
    """World-4 step of the case's layout from the world-2 run and the world-1 run's compute."""
    m2 = measured_from_summary(two, source="world 2")
    m1 = measured_from_summary(one, source="world 1")
    fc = forecast(m2, single=m1, sizes=(1, 2, TARGET))
    return step_time(fc.calibrated, CASES[case]["layout"], fc.topology, fc.placement).step_s


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--steps", type=int, default=80, help="training steps per run (the first 10 are warm-up)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run dirs here (default: a temporary folder)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="forecast-validation-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"run dirs under {root}; load average {load()} at {time.strftime('%H:%M:%S', time.gmtime())} UTC",
          flush=True)  # fmt: skip
    rows = []
    for case in args.cases:
        got = {}
        for world in (1, 2, TARGET):
            doc = manifest(case, world, args.steps)
            got[world] = run(doc, root / doc["metadata"]["name"])
            print(f"  {case} world {world}: step {got[world]['scaling']['perStep']['stepS'] * 1e3:.2f} ms "
                  f"(load {load()})", flush=True)  # fmt: skip
        pred = predict(case, got[1], got[2])
        meas = got[TARGET]["scaling"]["perStep"]["stepS"]
        rows.append((case, *(got[w]["scaling"]["perStep"]["stepS"] for w in (1, 2)), pred, meas))
    print(f"\nload average {load()} at {time.strftime('%H:%M:%S', time.gmtime())} UTC")
    print("| case | world 1 step ms | world 2 step ms | world 4 predicted ms | world 4 measured ms | error | within 15% |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for case, s1, s2, pred, meas in rows:
        err = pred / meas - 1
        ok &= abs(err) <= TOLERANCE
        print(f"| {case} | {s1 * 1e3:.2f} | {s2 * 1e3:.2f} | {pred * 1e3:.2f} | {meas * 1e3:.2f} | {err:+.1%} | "
              f"{'yes' if abs(err) <= TOLERANCE else 'no'} |")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
