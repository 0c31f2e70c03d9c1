"""`disttrain local` forks its trainer ranks from a forkserver that imported torch once
(launcher/forked_ranks.py), and such a rank still behaves as an exec'd one: its output in its log,
and no rank left behind when the launcher itself is killed with SIGKILL. A job whose env the
interpreter reads at start (PYTHONPATH here) gets exec'd ranks."""

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

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]


def manifest(tmp: Path, env: str = "") -> Path:
    path = tmp / "job.yaml"
    path.write_text(f"""\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: forked}}
spec:
  mode: data
  workers: {{replicas: 2, procsPerWorker: 1{env}}}
  model: {{name: mlp, hidden: 32, layers: 2}}
  data: {{name: digits, batchSize: 32, seed: 0}}
  optimizer: {{name: sgd, lr: 0.05}}
  training: {{steps: 1000000, logIntervalSteps: 1}}
  checkpoint: {{intervalSteps: 1000000}}
""")
    return path


def launch(tmp: Path, job: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "disttrain_cli", "local", str(job), "--run-dir", str(tmp / "run"),
                             "--no-progress", "--metrics-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def ranks_stepping(proc: subprocess.Popen[str], run: Path, deadline_s: float = 360) -> dict[int, int]:
    """The ranks' pids once rank 0 has logged a step (each rank's log says it runs)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the launcher ended: {proc.communicate()}")
        metrics = run / "metrics-rank0.jsonl"
        if metrics.exists() and any('"step"' in line for line in metrics.read_text().splitlines()):
            return {int(r): int(p) for r, p in json.loads((run / "pids.json").read_text())["pids"].items()}
        time.sleep(0.5)
    out, err = output_after_kill(proc)
    pytest.fail(f"no step within {deadline_s} s: {out[-2000:]} {err[-2000:]}")


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_forked_ranks_log_and_die_with_a_killed_launcher(tmp_path: Path) -> None:
    proc = launch(tmp_path, manifest(tmp_path))
    try:
        pids = ranks_stepping(proc, tmp_path / "run")
        servers = {parent_of(pid) for pid in pids.values()}
        assert len(servers) == 1 and proc.pid not in servers, (proc.pid, servers)
        (server,) = servers
        assert parent_of(server) == proc.pid
        assert "forkserver" in Path(f"/proc/{server}/cmdline").read_text()
        for rank, pid in pids.items():
            assert os.getsid(pid) == pid, f"rank {rank} is not in a session of its own"
        assert "disttrain-trainer" in (tmp_path / "run" / "logs" / "rank1.log").read_text()

        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(alive(p) for p in [server, *pids.values()]):
            time.sleep(0.2)
        assert not [p for p in [server, *pids.values()] if alive(p)], "a rank outlived its killed launcher"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_an_env_read_at_interpreter_start_gets_exec_d_ranks(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    env = f", template: {{env: [{{name: PYTHONPATH, value: '{extra}'}}]}}"
    proc = launch(tmp_path, manifest(tmp_path, env))
    try:
        pids = ranks_stepping(proc, tmp_path / "run")
        assert {parent_of(pid) for pid in pids.values()} == {proc.pid}
        cmdline = Path(f"/proc/{pids[0]}/cmdline").read_text().split("\0")
        assert cmdline[1:3] == ["-m", "disttrain_trainer"], cmdline
    finally:
        output_after_kill(proc)
