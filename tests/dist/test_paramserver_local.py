"""Parameter-server mode end to end with `disttrain local`: real server shards and worker processes.

The example reaches >= 0.95 test accuracy with 4 workers; a killed worker or a
killed server is replaced alone (no gang restart) and the job still Succeeds; a
replaced server resumes from its checkpoint.
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

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "paramserver.yaml"

MANIFEST = """\
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
  checkpoint: {{intervalSteps: 20, keep: 2}}
  runPolicy: {{backoffLimit: 2}}
"""


def start(manifest: Path, run_dir: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir", str(run_dir),
           "--fresh", "--no-progress", "--metrics-port", "0"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 900) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"disttrain local did not finish in {timeout} s:\n{out}")
    assert proc.returncode == 0, out
    return out


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(what: str, cond, proc: subprocess.Popen[str], timeout: float = 600):  # noqa: ANN001, ANN201
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"the job ended before {what}:\n{proc.communicate()[0]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


def pids(run_dir: Path) -> dict[int, int]:
    return {int(k): v for k, v in json.loads((run_dir / "pids.json").read_text())["pids"].items()}


def test_the_example_with_four_workers_reaches_095_and_succeeds(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = finish(start(EXAMPLE, run_dir))
    assert "Succeeded" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "paramserver" and summary["workers"] == 4 and summary["shards"] == 2
    assert summary["steps"] == 300 and summary["testAccuracy"] >= 0.95, summary
    assert summary["pushesAccepted"] > 0 and sum(summary["stalenessHistogram"].values()) > 0
    # Worker 0 exported the servers' final parameters next to the checkpoints.
    assert summary["export"]["step"] == 300
    assert (Path(summary["export"]["path"]) / summary["export"]["weights"]).is_file()
    # Every shard applied gradients from all workers, each within the bound it enforces.
    for i in range(2):
        server = json.loads((run_dir / f"server{i}-summary.json").read_text())
        assert server["stats"]["accepted"] == server["version"] > 300
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["status"] == "Succeeded" and local["restarts"] == 0


def test_a_killed_worker_is_replaced_alone_and_the_job_succeeds(tmp_path: Path) -> None:
    manifest = tmp_path / "ps.yaml"
    manifest.write_text(MANIFEST.format(name="ps-kill-worker", steps=300))
    run_dir = tmp_path / "run"
    proc = start(manifest, run_dir)
    wait_for("worker 1 logging step 20", lambda: any(r.get("step", 0) >= 20 for r in records(run_dir / "metrics-rank1.jsonl")), proc)  # fmt: skip
    before = pids(run_dir)  # ranks 0-1: workers, 2: the server
    os.kill(before[1], signal.SIGKILL)
    wait_for("worker 1 replaced", lambda: pids(run_dir)[1] != before[1], proc)
    finish(proc)
    after = pids(run_dir)
    assert after[0] == before[0] and after[2] == before[2]  # nobody else was restarted
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["status"] == "Succeeded" and local["restarts"] == 1
    log = (run_dir / "logs" / "rank1.log").read_text()
    assert "rank 1, replacement 1" in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300
    server = json.loads((run_dir / "server0-summary.json").read_text())
    assert server["resumedFromVersion"] is None
    # The replacement carried on from the server's count of worker 1's pushes: 300 each, no more.
    last1 = records(run_dir / "metrics-rank1.jsonl")[-1]
    assert last1["step"] == 300


def test_a_killed_server_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    manifest = tmp_path / "ps.yaml"
    manifest.write_text(MANIFEST.format(name="ps-kill-server", steps=300))
    run_dir = tmp_path / "run"
    proc = start(manifest, run_dir)
    log = run_dir / "metrics-server0.jsonl"
    saved = wait_for("a server checkpoint at version >= 60",
                     lambda: max((r["version"] for r in records(log) if r.get("event") == "checkpoint"
                                  and r["version"] >= 60), default=0), proc)  # fmt: skip
    before = pids(run_dir)
    os.kill(before[2], signal.SIGKILL)
    finish(proc)
    after = pids(run_dir)
    assert after[2] != before[2] and after[0] == before[0] and after[1] == before[1]
    server_log = (run_dir / "logs" / "rank2.log").read_text()
    assert "rank 2, replacement 1" in server_log
    server = json.loads((run_dir / "server0-summary.json").read_text())
    assert server["resumedFromVersion"] is not None and server["resumedFromVersion"] >= saved
    assert f"resumed from version {server['resumedFromVersion']}" in server_log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300 and summary["testAccuracy"] > 0.8
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["status"] == "Succeeded" and local["restarts"] == 1
