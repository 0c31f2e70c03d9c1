"""The loop-ablation benchmark's switches (benchmarks/loop_ablation.py) still reach the trainer's code:
a switch whose target was renamed would otherwise measure the full loop under a feature's name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a child: the switches patch the trainer's modules, which this process's other tests use.
CHILD = """
import sys
sys.path.insert(0, BENCH)
import loop_ablation as la
from disttrain_trainer.modes.data import entry, layouts, loop
from disttrain_trainer.telemetry import scaling_record, step_metrics

def targets():
    return {"metrics": step_metrics.Metrics.__init__, "comm-timer": layouts.comm_clock_for,
            "step-records": loop.fold_steps, "data": loop._batch, "gc": loop.LoopGC,
            "scheduler": entry.train, "stop-check": entry.train,
            "census": scaling_record.ScalingRecorder.with_census}

assert set(targets()) == set(la.FEATURES), sorted(set(targets()) ^ set(la.FEATURES))
for feature in la.FEATURES:
    before = targets()[feature]
    la.switch_off(feature)
    assert targets()[feature] is not before, feature
print("switched", len(la.FEATURES))
"""


def test_every_switch_replaces_its_target_in_the_trainer() -> None:
    child = CHILD.replace("BENCH", repr(str(ROOT / "benchmarks")))
    got = subprocess.run([sys.executable, "-c", child], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.strip() == "switched 8"


def test_an_unknown_feature_is_named() -> None:
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loop_ablation.py"), "telemetry"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert got.returncode != 0
    assert "unknown feature 'telemetry'" in got.stderr
