"""`disttrain local` with a pipeline: kill -9 of a stage -> gang restart -> the same parameters as without.

Stage 1 (rank 1) is SIGKILLed mid-run; the launcher restarts the gang, every stage
resumes its blocks, optimizer, the plan, sampler position and RNG streams from
the newest checkpoint, and the run ends with exactly the parameters of an
uninterrupted run of the same manifest (dropout on, so the RNG restore counts).
The partition is `uniform`: a profiled plan is timing and may differ between the
two runs, and with dropout a different split draws different random numbers
(the resumed run keeps the plan of its own checkpoint either way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from disttrain_trainer.checkpoints import whole as checkpoint

JOB = "pipe-restart"
STEPS = 100
KILL_AFTER_STEP = 45

MANIFEST = f"""\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {JOB}}}
spec:
  mode: pipeline
  workers: {{replicas: 2, procsPerWorker: 1}}
  parallelism: {{pipeline: 2, schedule: 1F1B, microbatches: 4, partition: uniform}}
  model: {{name: mlp, hidden: 64, layers: 4, dropout: 0.1}}
  data: {{name: digits, batchSize: 64, seed: 5, shards: 2}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, baseBatchSize: 64, warmupSteps: 10, decay: cosine}}
  training: {{steps: {STEPS}, logIntervalSteps: 1}}
  checkpoint: {{intervalSteps: 20, keep: 2}}
  runPolicy: {{backoffLimit: 2}}
"""


def cmd(manifest: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir", str(run_dir),
            "--fresh", "--no-progress", "--metrics-port", "0"]  # fmt: skip


def last_step(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics-rank0.jsonl").read_text().splitlines()
    except OSError:
        return -1
    steps = []
    for line in lines:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            pass  # an event record, or a line still being written
    return max(steps, default=-1)


def final_blocks(run_dir: Path) -> dict:
    found = checkpoint.load_latest(run_dir / "checkpoints" / JOB)
    assert found is not None and found[0] == STEPS
    return found[1]["blocks"]


@pytest.mark.timeout(900)
def test_kill_9_of_a_stage_resumes_equal_to_uninterrupted(tmp_path: Path) -> None:
    manifest = tmp_path / "pipe.yaml"
    manifest.write_text(MANIFEST)
    ref_dir, int_dir = tmp_path / "reference", tmp_path / "interrupted"
    ref = subprocess.run(cmd(manifest, ref_dir), capture_output=True, text=True, timeout=400)
    assert ref.returncode == 0, ref.stdout + ref.stderr

    proc = subprocess.Popen(cmd(manifest, int_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"the launcher ended before the kill: {proc.communicate()}"
            assert time.monotonic() < deadline, "rank 0 never reached the kill step"
            if last_step(int_dir) >= KILL_AFTER_STEP and checkpoint.list_checkpoints(int_dir / "checkpoints" / JOB):
                pid = int(json.loads((int_dir / "pids.json").read_text())["pids"]["1"])
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.01)
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    assert proc.returncode == 0, out + err
    assert f"rank 1 (pid {pid}) killed by SIGKILL" in out
    summary = json.loads((int_dir / "local-summary.json").read_text())
    assert summary["status"] == "Succeeded" and summary["restarts"] == 1
    assert 0 < summary["resumedFromStep"] < STEPS
    ref_blocks, int_blocks = final_blocks(ref_dir), final_blocks(int_dir)
    assert ref_blocks.keys() == int_blocks.keys() and ref_blocks
    for key, t in ref_blocks.items():
        diff = (t.double() - int_blocks[key].double()).abs().max().item()
        assert diff <= 1e-6, f"{key}: max |diff| {diff}"
