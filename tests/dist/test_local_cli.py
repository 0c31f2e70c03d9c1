"""`disttrain local` end to end with real trainer processes: validation, CPU fallback,
resume of an existing run dir, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from subprocs import output_after_kill  # tests/dist/subprocs.py: conftest.py puts this folder on sys.path

MANIFEST = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: {name}}}
spec:
  mode: data
  workers: {{replicas: {replicas}, procsPerWorker: {procs}, resources: {{gpus: {gpus}}}}}
  model: {{name: mlp, hidden: 64, layers: 1}}
  data: {{name: digits, batchSize: {batch}, seed: 3, shards: 2}}
  optimizer: {{name: sgd, lr: 0.05, baseBatchSize: 64, decay: none}}
  training: {{steps: {steps}, logIntervalSteps: 5}}
  checkpoint: {{intervalSteps: 20, keep: 1}}
"""


def manifest(tmp: Path, name: str, *, replicas: int = 2, procs: int = 1, gpus: int = 0,
             batch: int = 64, steps: int = 40) -> Path:  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(
        MANIFEST.format(
            name=name, replicas=replicas, procs=procs, gpus=gpus, batch=batch, steps=steps
        )
    )
    return path


def cmd(path: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "disttrain_cli",
        "local",
        str(path),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def run(path: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd(path, run_dir, "--no-progress", "--metrics-port", "0", *extra),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_bad_manifest_exits_2_naming_the_fields_and_starts_nothing(tmp_path: Path) -> None:
    path = manifest(tmp_path, "bad-job", replicas=0)
    text = path.read_text().replace("batchSize: 64", "batchSize: many")
    path.write_text(text)
    result = run(path, tmp_path / "run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}: spec.workers.replicas: 0 must be >= 1" in result.stderr
    assert f"{path}: spec.data.batchSize: expected an integer" in result.stderr
    assert "nothing was started" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_cross_field_error_is_reported_like_validate(tmp_path: Path) -> None:
    path = manifest(tmp_path, "odd-batch", replicas=2, batch=63)
    result = run(path, tmp_path / "run")
    assert result.returncode == 2
    assert "spec.data.batchSize" in result.stderr
    validate = subprocess.run([sys.executable, "-m", "disttrain_cli", "validate", str(path)],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [line for line in validate.stderr.splitlines() if line.startswith(str(path))]
    assert problems and all(p in result.stderr for p in problems)


# Three `disttrain local` runs: 223 s in CI, 311 s in a fresh `make test` here (load average 30, the
# forkserver's imports 44 s a run), so the suite's default timeout (900 s), not a tighter one.
def test_gpus_without_cuda_fall_back_to_cpu_and_a_run_dir_resumes_unless_fresh(
    tmp_path: Path,
) -> None:
    import torch

    # One pod with 2 processes (procsPerWorker = gpus = 2): RANK/LOCAL_RANK come from the launcher.
    path = manifest(tmp_path, "cpu-fallback", replicas=1, procs=2, gpus=2, steps=40)
    run_dir = tmp_path / "run"
    first = run(path, run_dir)
    assert first.returncode == 0, first.stdout + first.stderr
    if not torch.cuda.is_available():
        assert (
            "warning: workers.resources.gpus=2 but CUDA is not available on this machine: running on CPU"
            in first.stderr
        )
    assert (
        "Succeeded" in first.stdout
        and "test accuracy" in first.stdout
        and "steps          40/40" in first.stdout
    )
    trainer = json.loads((run_dir / "summary.json").read_text())
    assert (
        trainer["worldSize"] == 2
        and trainer["steps"] == 40
        and trainer["resumedFromStep"] is None
    )
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert (
        local["plot"] == str(run_dir.resolve() / "training.png") and Path(local["plot"]).is_file()
    )
    assert json.loads((run_dir / "termination-log").read_text())["steps"] == 40
    assert {p.name for p in (run_dir / "logs").iterdir()} == {"rank0.log", "rank1.log", "forkserver.log"}

    # Same run dir, more steps: resumes from the step-40 checkpoint.
    longer = manifest(tmp_path, "cpu-fallback", replicas=1, procs=2, gpus=2, steps=60)
    second = run(longer, run_dir)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming from the checkpoints in" in second.stdout
    assert json.loads((run_dir / "summary.json").read_text())["resumedFromStep"] == 40

    # --fresh starts over.
    third = run(longer, run_dir, "--fresh")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "resuming" not in third.stdout
    assert json.loads((run_dir / "summary.json").read_text())["resumedFromStep"] is None


def _as_in_a_terminal() -> None:
    """SIGINT as a foreground command in a terminal gets it. A suite started as a background job
    of a non-interactive shell (`make test &`) inherits SIGINT ignored, and so would the launcher:
    Python keeps an inherited "ignore", so Ctrl-C would never reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _proc_state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "gone"
    return next((line for line in status.splitlines() if line.startswith("State:")), "?")


@pytest.mark.timeout(480)
def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    path = manifest(tmp_path, "interrupt-me", steps=1_000_000)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(cmd(path, run_dir, "--metrics-port", "0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_as_in_a_terminal)  # fmt: skip
    try:
        # The first step took 235 s to come once, beside the cluster tier's training pods on a 2-core host.
        deadline = time.monotonic() + 360
        while (
            not (run_dir / "metrics-rank0.jsonl").is_file()
            or not (run_dir / "metrics-rank0.jsonl").stat().st_size
        ):
            assert proc.poll() is None and time.monotonic() < deadline, output_after_kill(proc)
            time.sleep(0.1)
        pids = [int(p) for p in json.loads((run_dir / "pids.json").read_text())["pids"].values()]
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the launcher prints its Python stacks to stderr
            time.sleep(2)
            proc.kill()
            out, err = proc.communicate()
            alive = {pid: _proc_state(pid) for pid in pids}
            pytest.fail(f"the launcher did not stop within 60 s of SIGINT; ranks: {alive}\n"
                        f"stdout tail:\n{out[-3000:]}\nstderr:\n{err[-6000:]}")  # fmt: skip
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "Interrupted: stopped by the user" in out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
