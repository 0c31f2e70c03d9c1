"""`disttrain local` with real trainer processes on gloo: gang restart after kill -9.

The interrupted run must end with exactly the parameters of an uninterrupted
run with the same seed: the trainer resumes model, optimizer, scheduler,
sampler position and RNG from the newest checkpoint, and the launcher restarts
the whole gang with DISTTRAIN_RESTART_ATTEMPT + 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from disttrain_api import constants as C

JOB = "local-restart"
STEPS = 300
KILL_AFTER_STEP = 60

MANIFEST = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: data
  workers: {{replicas: 2, procsPerWorker: 1}}
  model: {{name: mlp, hidden: 256, layers: 2}}
  data: {{name: digits, batchSize: 64, seed: 7, shards: 2}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, baseBatchSize: 64, warmupSteps: 10, decay: cosine}}
  training: {{steps: {steps}, logIntervalSteps: 1}}
  checkpoint: {{intervalSteps: 20, keep: 2}}
  runPolicy: {{backoffLimit: {backoff}}}
"""


def write_manifest(tmp: Path, *, name: str = JOB, steps: int = STEPS, backoff: int = 2) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(MANIFEST.format(name=name, steps=steps, backoff=backoff))
    return path


def local_cmd(manifest: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "disttrain_cli",
        "local",
        str(manifest),
        "--run-dir",
        str(run_dir),
        "--fresh",
        "--no-progress",
        "--metrics-port",
        "0",
    ]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(C.ENV_FAULT_KILL_IN_CHECKPOINT, None)
    env.update(extra)
    return env


def run_local(
    manifest: Path, run_dir: Path, timeout: float = 300, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        local_cmd(manifest, run_dir),
        env=child_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
            pass  # a line still being written
    return max(steps, default=-1)


def final_state(run_dir: Path, job: str = JOB) -> tuple[int, dict[str, Any]]:
    from disttrain_trainer.checkpoints import whole as checkpoint

    found = checkpoint.load_latest(run_dir / "checkpoints" / job)
    assert found is not None, f"no checkpoint in {run_dir}"
    return found


def kill_rank1_mid_run(
    proc: subprocess.Popen[str], run_dir: Path, timeout: float = 240
) -> tuple[int, int]:
    """Wait until rank 0 logged step >= KILL_AFTER_STEP and a checkpoint exists, then SIGKILL rank 1."""
    from disttrain_trainer.checkpoints import whole as checkpoint

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the launcher ended before the kill: {proc.communicate()}"
        step = last_step(run_dir)
        if step >= KILL_AFTER_STEP and checkpoint.list_checkpoints(run_dir / "checkpoints" / JOB):
            pids = json.loads((run_dir / "pids.json").read_text())
            assert pids["attempt"] == 0
            pid = int(pids["pids"]["1"])
            os.kill(pid, signal.SIGKILL)
            return step, pid
        time.sleep(0.01)
    raise AssertionError(f"rank 0 never reached step {KILL_AFTER_STEP} in {run_dir}")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the launcher stops its gang on SIGINT
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(900)
def test_kill_9_restarts_the_gang_and_ends_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path)
    ref_dir, int_dir = tmp_path / "reference", tmp_path / "interrupted"

    ref = run_local(manifest, ref_dir)
    assert ref.returncode == 0, ref.stdout + ref.stderr

    proc = subprocess.Popen(
        local_cmd(manifest, int_dir),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        killed_at, pid = kill_rank1_mid_run(proc, int_dir)
        out, err = proc.communicate(timeout=300)
    finally:
        stop(proc)
    assert proc.returncode == 0, out + err
    assert killed_at < STEPS, "the kill must land mid-run"
    assert f"rank 1 (pid {pid}) killed by SIGKILL" in out
    assert "restarting the gang" in out

    summary = json.loads((int_dir / "local-summary.json").read_text())
    assert summary["status"] == "Succeeded" and summary["restarts"] == 1
    assert summary["steps"] == STEPS
    assert (
        summary["resumedFromStep"] is not None and 0 < summary["resumedFromStep"] <= killed_at
    )
    assert "restarts" in out and "(resumed from step" in out
    trainer_summary = json.loads((int_dir / "summary.json").read_text())
    assert trainer_summary["steps"] == STEPS

    ref_step, ref_state = final_state(ref_dir)
    int_step, int_state = final_state(int_dir)
    assert ref_step == int_step == STEPS
    ref_model, int_model = ref_state["model"], int_state["model"]
    assert ref_model.keys() == int_model.keys() and ref_model
    for key, ref_tensor in ref_model.items():
        diff = (ref_tensor.double() - int_model[key].double()).abs().max().item()
        assert diff <= 1e-6, f"{key}: max |diff| {diff}"
    assert (int_dir / "training.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(600)
def test_backoff_limit_exhausted_fails_with_the_reason(tmp_path: Path) -> None:
    # Rank 0 SIGKILLs itself while writing the step-20 checkpoint, in every attempt:
    # a deterministic crash loop, as a job with a persistent fault would have.
    manifest = write_manifest(tmp_path, name="local-crashloop", steps=60, backoff=1)
    result = run_local(manifest, tmp_path / "run", **{C.ENV_FAULT_KILL_IN_CHECKPOINT: "20"})
    assert result.returncode not in (0, 2), result.stdout + result.stderr
    assert "BackoffLimitExceeded: 1 restarts (runPolicy.backoffLimit=1)" in result.stderr
    assert "rank 0" in result.stderr and "killed by SIGKILL" in result.stderr
    summary = json.loads((tmp_path / "run" / "local-summary.json").read_text())
    assert summary["status"] == "Failed" and summary["restarts"] == 1
    assert "restarting the gang from the newest checkpoint (restart 1/1)" in result.stdout
