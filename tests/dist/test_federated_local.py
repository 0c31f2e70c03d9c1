"""`disttrain local` runs a federated job: the aggregator process plus client processes."""

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
EXAMPLE = ROOT / "manifests" / "examples" / "federated.yaml"

pytestmark = pytest.mark.dist


def _cmd(path: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "disttrain_cli", "local", str(path), "--run-dir", str(run_dir),
            "--no-progress", "--metrics-port", "0"]  # fmt: skip


def test_the_federated_example_reaches_090_on_non_iid_digits(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    p = subprocess.run(_cmd(EXAMPLE, run_dir), capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    local = json.loads((run_dir / "local-summary.json").read_text())
    trainer = json.loads((run_dir / "summary.json").read_text())
    assert local["status"] == "Succeeded" and local["steps"] == 30 and local["restarts"] == 0
    assert local["testAccuracy"] >= 0.90, trainer["accuracyPerRound"]
    assert len(trainer["accuracyPerRound"]) == 30 and trainer["rounds"] == 30
    # The aggregator exported the global model before telling the clients (whose summary names it).
    assert trainer["export"]["step"] == 30
    assert (Path(trainer["export"]["path"]) / trainer["export"]["weights"]).is_file()
    rounds = [json.loads(line) for line in (run_dir / "metrics-rank0.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == list(range(1, 31))
    assert all(r["unmasked_dropped"] == 0 and r["clients_answered"] == 5 for r in rounds)
    assert all(r["bytes_up"] > 0 and r["compute_s"] > 0 for r in rounds)
    # Each client process logged its clients' rounds (compute vs communication per client).
    events = [json.loads(line) for f in run_dir.glob("metrics-client*.jsonl") for line in f.read_text().splitlines()]
    assert len({e["client"] for e in events}) == 10 and all(e["accepted"] for e in events)
    assert (run_dir / "training.png").exists()


MANIFEST = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: fed-lost-client}
spec:
  mode: federated
  workers: {replicas: 2}
  model: {name: mlp, hidden: 32, layers: 1}
  data: {name: digits, batchSize: 32}
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, decay: none}
  federated: {clients: 6, clientsPerRound: 3, minAnsweredClients: 1, rounds: 10, roundTimeoutSeconds: 2,
              partition: {kind: iid}}
"""


def test_a_lost_client_process_is_not_restarted_and_the_rounds_go_on(tmp_path: Path) -> None:
    spec = tmp_path / "fed.yaml"
    spec.write_text(MANIFEST)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_cmd(spec, run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = run_dir / "metrics-rank0.jsonl"
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count("\n") >= 1):
            assert time.monotonic() < deadline and proc.poll() is None, "no round finished"
            time.sleep(0.05)
        pids = json.loads((run_dir / "pids.json").read_text())["pids"]
        # Freeze the aggregator (rank 2 = world size) so the remaining rounds cannot all finish,
        # and the clients exit, before the kill lands; then let it go on without client process 1.
        os.kill(pids["2"], signal.SIGSTOP)
        try:
            os.kill(pids["1"], signal.SIGKILL)  # client process rank 1: clients 1, 3, 5
        finally:
            os.kill(pids["2"], signal.SIGCONT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "client process lost" in out
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["status"] == "Succeeded" and local["restarts"] == 0 and local["steps"] == 10
    rounds = [json.loads(line) for line in (run_dir / "metrics-rank0.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == list(range(1, 11))
    assert any(r["clients_dropped"] > 0 for r in rounds)  # the lost clients were sampled and dropped
