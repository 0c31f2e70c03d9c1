"""Chaos with `disttrain local`: five kill -9s of workers at random (seeded) steps of one run.

The job must still Succeed, and its final parameters must equal those of an
uninterrupted run: every restart resumes model, optimizer, scheduler, sampler
position and RNG streams exactly from the newest checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt

JOB = "chaos"
# Long enough that the job cannot finish before the poller below sees its last attempt's steps:
# each attempt resumes a few steps before its kill, so the fifth still has some 970 steps to run
# (6 s on an idle host; 100 steps once ran out before the poller woke on a busy 2-core one).
STEPS = 1000
KILLS = 5
SEED = 20240611
MANIFEST = f"""\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {JOB}}}
spec:
  mode: data
  workers: {{replicas: 2, procsPerWorker: 1}}
  model: {{name: mlp, hidden: 256, layers: 2}}
  data: {{name: digits, batchSize: 64, seed: 5, shards: 2}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, baseBatchSize: 64, warmupSteps: 10, decay: cosine}}
  training: {{steps: {STEPS}, logIntervalSteps: 1}}
  checkpoint: {{intervalSteps: 5, keep: 2}}
  runPolicy: {{backoffLimit: {KILLS + 1}}}
"""


def local_cmd(manifest: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir",
            str(run_dir), "--fresh", "--no-progress", "--metrics-port", "0"]  # fmt: skip


class StepTail:
    """The steps rank 0 logs from byte `offset` of its metrics file on, read incrementally: each poll
    parses only what was written since the last (a poll that re-read the whole attempt would itself
    slow down as the file grows, on the same cores as the job)."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path, self.pos, self.steps = path, offset, []

    def poll(self) -> list[int]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return self.steps
        done = chunk.rfind(b"\n") + 1  # complete lines only: the last may still be being written
        self.pos += done
        for line in chunk[:done].decode().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "event" not in record:
                self.steps.append(int(record["step"]))
        return self.steps


def wait_for_attempt(proc: subprocess.Popen[str], run_dir: Path, attempt: int) -> dict[str, int]:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the launcher ended before attempt {attempt}: {proc.communicate()}"
        try:
            pids = json.loads((run_dir / "pids.json").read_text())
        except (OSError, ValueError):
            pids = {}
        if pids.get("attempt") == attempt:
            return {int(rank): int(pid) for rank, pid in pids["pids"].items()}
        time.sleep(0.01)
    raise AssertionError(f"attempt {attempt} never started")


def kill_at_random_steps(proc: subprocess.Popen[str], run_dir: Path) -> list[tuple[int, int]]:
    rng = random.Random(SEED)
    log = run_dir / "metrics-rank0.jsonl"
    kills = []
    for attempt in range(KILLS):
        pids = wait_for_attempt(proc, run_dir, attempt)
        offset = log.stat().st_size if log.exists() else 0  # this attempt's steps start here
        # A few steps past the resume point: five kills must land before step STEPS even
        # when this poller lags (each attempt resumes from the last checkpoint before its kill).
        rank, after = rng.choice(sorted(pids)), rng.randint(1, 5)
        target = None
        tail = StepTail(log, offset)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the job ended after {len(kills)} kills: {proc.communicate()}"
            steps = tail.poll()
            if steps and target is None:
                target = steps[0] + after  # `after` steps past where this attempt resumed
            if target is not None and steps[-1] >= target:
                os.kill(pids[rank], signal.SIGKILL)
                kills.append((rank, steps[-1]))
                break
            time.sleep(0.005)
        else:
            raise AssertionError(f"attempt {attempt} never reached its kill step")
    return kills


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load(run_dir / "checkpoints" / JOB, STEPS)["model"]


@pytest.mark.timeout(1200)
def test_five_kill_9s_at_random_steps_end_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    manifest = tmp_path / "chaos.yaml"
    manifest.write_text(MANIFEST)
    ref_dir, chaos_dir = tmp_path / "reference", tmp_path / "chaos"
    ref = subprocess.run(local_cmd(manifest, ref_dir), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stdout + ref.stderr

    proc = subprocess.Popen(local_cmd(manifest, chaos_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        kills = kill_at_random_steps(proc, chaos_dir)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert len(kills) == KILLS and all(step < STEPS for _, step in kills), kills
    assert out.count("killed by SIGKILL") == KILLS, out
    summary = json.loads((chaos_dir / "local-summary.json").read_text())
    assert summary["status"] == "Succeeded" and summary["restarts"] == KILLS, summary
    assert summary["steps"] == STEPS

    ref_model, chaos_model = final_model(ref_dir), final_model(chaos_dir)
    assert ref_model.keys() == chaos_model.keys() and ref_model
    for key, tensor in ref_model.items():
        diff = float((tensor.double() - chaos_model[key].double()).abs().max())
        assert diff <= 1e-6, f"{key}: max |diff| {diff} after kills {kills}"
