"""A finished gang exits cleanly, every time: `disttrain local` back to back with no abort and
no restart, and a finished run resumed again reports the finished run's summary."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

# The abort at exit this guards against was intermittent: several gangs in a row, each a fresh exit.
RUNS = 5
# The 2-process shape that aborted at exit on a fresh machine: one pod, two processes.
MANIFEST = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: clean-exit}
spec:
  mode: data
  workers: {replicas: 1, procsPerWorker: 2}
  model: {name: mlp, hidden: 32, layers: 1}
  data: {name: digits, batchSize: 64, seed: 3, shards: 2}
  optimizer: {name: sgd, lr: 0.05, baseBatchSize: 64, decay: none}
  training: {steps: 5, logIntervalSteps: 5}
  checkpoint: {intervalSteps: 5, keep: 1}
  runPolicy: {backoffLimit: 3}
"""


def local(manifest: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir",
           str(run_dir), "--no-progress", "--metrics-port", "0", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(1200)
def test_five_runs_back_to_back_never_abort_or_restart(tmp_path: Path) -> None:
    manifest = tmp_path / "clean-exit.yaml"
    manifest.write_text(MANIFEST)
    run_dir = tmp_path / "run"
    for i in range(RUNS):
        res = local(manifest, run_dir, "--fresh")
        logs = "".join(p.read_text() for p in sorted((run_dir / "logs").iterdir()))
        context = f"run {i}:\n{res.stdout}\n{res.stderr}\n{logs[-3000:]}"
        assert res.returncode == 0, context
        assert "terminate called" not in logs and "restarting" not in res.stdout, context
        local_summary = json.loads((run_dir / "local-summary.json").read_text())
        assert local_summary["restarts"] == 0 and local_summary["status"] == "Succeeded", context
        trainer = json.loads((run_dir / "summary.json").read_text())
        assert trainer["steps"] == 5 and math.isfinite(trainer["finalLoss"]), trainer
        assert trainer["samplesPerS"] > 0 and 0 < trainer["testAccuracy"] <= 1, trainer

    # Once more without --fresh: the run is finished, nothing is trained, and the
    # summary is the finished run's own (kept with the final checkpoint), not NaN or 0.
    again = local(manifest, run_dir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from the checkpoints" in again.stdout
    assert json.loads((run_dir / "summary.json").read_text()) == trainer
    final = json.loads((run_dir / "local-summary.json").read_text())
    assert final["restarts"] == 0 and final["finalLoss"] == trainer["finalLoss"], final
