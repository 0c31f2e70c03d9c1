"""SIGTERM with real trainer processes: the gang stops after one step every rank agrees on, with
that step checkpointed, and a resumed run ends exactly where an uninterrupted one does.

Kubernetes stops a pod with SIGTERM (suspend, drain, eviction, preemption) and SIGKILLs it a
grace period later; `disttrain local` stops its gang the same way. A SIGTERM sent to one trainer
process by someone else (here: the test, standing in for a drain) stops it the same way, but the
launcher did not ask for it, so the restart counts against backoffLimit (as the operator counts an
exit 3 of a pod nobody deleted). The manifests checkpoint only at the end (intervalSteps > steps):
whatever was saved mid-run was saved on the stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from disttrain_api import exitcodes
from disttrain_trainer.checkpoints import whole as checkpoint

# Long enough that a stop lands mid-run: the loop checks for one about every second (stop_agreement.py).
STEPS = 3000
SIGNAL_AFTER_STEP = 100

DATA = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: data
  workers: {{replicas: 2, procsPerWorker: 1}}
  model: {{name: mlp, hidden: 128, layers: 2, dropout: 0.1}}
  data: {{name: digits, batchSize: 64, seed: 11, shards: 2}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, baseBatchSize: 64, warmupSteps: 10, decay: cosine}}
  training: {{steps: {steps}, logIntervalSteps: 10}}
  checkpoint: {{intervalSteps: 100000, keep: 2}}
  runPolicy: {{backoffLimit: 1, terminationGracePeriodSeconds: 60}}
"""
# One pod with two processes: SIGTERM reaches only the pod's first process (as in a container),
# which must pass it on to its local ranks.
PIPELINE = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: pipeline
  workers: {{replicas: 1, procsPerWorker: 2}}
  parallelism: {{pipeline: 2, schedule: 1F1B, microbatches: 4, partition: uniform}}
  model: {{name: mlp, hidden: 64, layers: 4}}
  data: {{name: digits, batchSize: 64, seed: 5, shards: 2}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, baseBatchSize: 64, decay: none}}
  training: {{steps: {steps}, logIntervalSteps: 5}}
  checkpoint: {{intervalSteps: 100000, keep: 2}}
  runPolicy: {{backoffLimit: 1}}
"""
# What the launcher says of an exit 3 it did not ask for.
UNASKED = "a stop disttrain local did not ask for: counted as a failure"


def manifest(tmp: Path, template: str, name: str, steps: int = STEPS) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(template.format(name=name, steps=steps))
    return path


def local(path: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "disttrain_cli", "local", str(path), "--run-dir", str(run_dir),
            "--no-progress", "--metrics-port", "0", *extra]  # fmt: skip


@contextlib.contextmanager
def launched(path: Path, run_dir: Path, *extra: str, merge_stderr: bool = False) -> Iterator[subprocess.Popen[str]]:
    """`disttrain local` in the background; stopped (SIGINT, then SIGKILL) if the test leaves it running."""
    proc = subprocess.Popen(local(path, run_dir, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def pids(run_dir: Path) -> dict[int, int]:
    return {int(k): v for k, v in json.loads((run_dir / "pids.json").read_text())["pids"].items()}


def last_step(run_dir: Path) -> int:
    steps = []
    try:
        lines = (run_dir / "metrics-rank0.jsonl").read_text().splitlines()
    except OSError:
        return -1
    for line in lines:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            pass  # an event record, or a line still being written
    return max(steps, default=-1)


def wait_for_step(proc: subprocess.Popen[str], run_dir: Path, step: int, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()}"
        if (reached := last_step(run_dir)) >= step:
            return reached
        time.sleep(0.02)
    raise AssertionError(f"rank 0 never reached step {step} in {run_dir}")


def saved_steps(run_dir: Path, job: str) -> list[int]:
    return [s for s, _ in checkpoint.list_checkpoints(run_dir / "checkpoints" / job)]


def logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").iterdir()))


def final_model(run_dir: Path, job: str, key: str = "model") -> dict[str, Any]:
    found = checkpoint.load_latest(run_dir / "checkpoints" / job)
    assert found is not None and found[0] == STEPS
    return found[1][key]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.timeout(900)
def test_sigterm_checkpoints_the_step_reached_and_the_resumed_run_ends_equal(tmp_path: Path) -> None:
    job = "sigterm-data"
    path = manifest(tmp_path, DATA, job)
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "stopped"
    ref = subprocess.run(local(path, ref_dir, "--fresh"), capture_output=True, text=True, timeout=400)
    assert ref.returncode == 0, ref.stdout + ref.stderr

    # 1. SIGTERM to `disttrain local`: it passes it on to the gang, as the kubelet does to pods.
    with launched(path, run_dir, "--fresh") as proc:
        seen = wait_for_step(proc, run_dir, SIGNAL_AFTER_STEP)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    context = f"{out}\n{err}\n{logs(run_dir)[-4000:]}"
    assert proc.returncode == exitcodes.INTERRUPTED, context
    # Promptly: a couple of seconds of steps and a small checkpoint, far inside the grace period
    # (60 s) after which the launcher would SIGKILL it.
    assert took < 45, f"{took:.1f} s from SIGTERM to exit\n{context}"
    (stopped_at,) = saved_steps(run_dir, job)  # no periodic checkpoint: this one was written on the stop
    assert seen <= stopped_at < STEPS, context
    # The checkpoint is the step the trainer had reached: its last progress record is that step.
    assert abs(last_step(run_dir) - stopped_at) <= 1, context
    assert f"stopped on request after step {stopped_at}" in context
    assert "Traceback" not in logs(run_dir), context

    # 2. Resumed; then SIGTERM to rank 1 alone, from outside the launcher: rank 0 stops after the
    # same step and saves it, and the launcher restarts the gang from there, counting a restart (it
    # did not ask for that stop).
    with launched(path, run_dir) as proc:
        wait_for_step(proc, run_dir, stopped_at + SIGNAL_AFTER_STEP)
        os.kill(pids(run_dir)[1], signal.SIGTERM)
        out, err = proc.communicate(timeout=400)
    context = f"{out}\n{err}\n{logs(run_dir)[-4000:]}"
    assert proc.returncode == 0, context
    assert UNASKED in out and "restarting the gang from the newest checkpoint (restart 1/1)" in out, context
    assert json.loads((run_dir / "local-summary.json").read_text())["restarts"] == 1, context
    summary = json.loads((run_dir / "summary.json").read_text())
    assert stopped_at < summary["resumedFromStep"] < STEPS and summary["steps"] == STEPS, summary
    assert f"stopped on request after step {summary['resumedFromStep']}" in (run_dir / "logs" / "rank0.log").read_text()
    # Dropout: each rank's RNG stream, the sampler and the optimizer resume exactly, twice.
    assert max_diff(final_model(ref_dir, job), final_model(run_dir, job)) <= 1e-6


@pytest.mark.timeout(600)
def test_sigterm_to_a_pods_first_process_stops_both_pipeline_stages_at_one_step(tmp_path: Path) -> None:
    job = "sigterm-pipe"
    # About 8 s of steps on a quiet host: the stop must land mid-run even when this test process
    # waits seconds for a CPU (200 steps, 2 s, once ran to the end before the signal was sent).
    steps = 1000
    path = manifest(tmp_path, PIPELINE, job, steps=steps)
    run_dir = tmp_path / "run"
    with launched(path, run_dir, "--fresh") as proc:
        wait_for_step(proc, run_dir, 30)
        os.kill(pids(run_dir)[0], signal.SIGTERM)  # only the first process, as a container runtime does
        out, err = proc.communicate(timeout=400)
    context = f"{out}\n{err}\n{logs(run_dir)[-4000:]}"
    assert proc.returncode == 0, context
    # Not a stop the launcher asked for: one restart (backoffLimit 1).
    assert UNASKED in out, context
    summary = json.loads((run_dir / "local-summary.json").read_text())
    assert summary["status"] == "Succeeded" and summary["restarts"] == 1, summary
    stopped_at = json.loads((run_dir / "summary.json").read_text())["resumedFromStep"]
    text = logs(run_dir)
    assert f"stopped on request after step {stopped_at}" in text, context  # both stages saved that step
    assert 30 <= stopped_at < steps and "exit code 3" in out, context


PARAMSERVER = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: paramserver
  workers: {{replicas: 2}}
  model: {{name: mlp, hidden: 32, layers: 1}}
  data: {{name: digits, batchSize: 64, seed: 1}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, decay: none}}
  training: {{steps: {steps}, logIntervalSteps: 5}}
  paramServer: {{maxStaleness: 4, shards: 1}}
  checkpoint: {{intervalSteps: 100000, keep: 2}}
  runPolicy: {{backoffLimit: 2}}
"""


def wait_until(what: str, cond: Any, proc: subprocess.Popen[str], timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := cond():
            return got
        assert proc.poll() is None, f"the job ended before {what}: {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(600)
def test_sigterm_to_a_parameter_server_and_a_worker_replaces_them_alone(tmp_path: Path) -> None:
    steps = 1500  # the second stop must land before the run ends, on a busy host too
    path = manifest(tmp_path, PARAMSERVER, "sigterm-ps", steps=steps)
    run_dir = tmp_path / "run"
    with launched(path, run_dir, "--fresh", merge_stderr=True) as proc:
        wait_for_step(proc, run_dir, 40)
        before = pids(run_dir)  # ranks 0-1: workers, 2: the server shard
        os.kill(before[2], signal.SIGTERM)
        wait_until("the server replaced", lambda: pids(run_dir)[2] != before[2], proc)
        os.kill(before[1], signal.SIGTERM)
        out, _ = proc.communicate(timeout=400)
    text = logs(run_dir)
    assert proc.returncode == 0, out + text[-4000:]
    # Neither stop was the launcher's: each counts (backoffLimit 2), and only that process is replaced.
    local_summary = json.loads((run_dir / "local-summary.json").read_text())
    assert local_summary["status"] == "Succeeded" and local_summary["restarts"] == 2, out
    assert out.count(f"({UNASKED}): replacing only that process") == 2, out
    # The shard saved its state when it stopped (there is no periodic checkpoint) and resumed from it.
    server = json.loads((run_dir / "server0-summary.json").read_text())
    assert f"stopped on request at version {server['resumedFromVersion']}" in text, text[-4000:]
    assert server["resumedFromVersion"] > 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == steps


FEDERATED = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: federated
  workers: {{replicas: 2}}
  model: {{name: mlp, hidden: 32, layers: 1}}
  data: {{name: digits, batchSize: 32}}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, decay: none}}
  federated: {{clients: 4, clientsPerRound: 2, rounds: {steps}, roundTimeoutSeconds: 20, partition: {{kind: iid}}}}
  runPolicy: {{backoffLimit: 1}}
"""


@pytest.mark.timeout(600)
def test_sigterm_to_the_aggregator_resumes_the_rounds(tmp_path: Path) -> None:
    rounds = 400  # a round takes about 25 ms here: 40 could all finish before the signal was sent
    path = manifest(tmp_path, FEDERATED, "sigterm-fed", steps=rounds)
    run_dir = tmp_path / "run"
    with launched(path, run_dir, "--fresh", merge_stderr=True) as proc:
        wait_for_step(proc, run_dir, 5)
        aggregator = max(pids(run_dir).items())[1]  # the aggregator is the rank after the clients
        os.kill(aggregator, signal.SIGTERM)
        out, _ = proc.communicate(timeout=400)
    text = logs(run_dir)
    assert proc.returncode == 0, out + text[-4000:]
    assert UNASKED in out, out
    local_summary = json.loads((run_dir / "local-summary.json").read_text())
    assert local_summary["status"] == "Succeeded" and local_summary["restarts"] == 1, out
    summary = json.loads((run_dir / "summary.json").read_text())
    # Every finished round was checkpointed: the aggregator resumed at least where it was signalled.
    assert summary["resumedFromStep"] >= 5 and summary["rounds"] == rounds, summary
    assert "aggregator: stopped on request" in text
