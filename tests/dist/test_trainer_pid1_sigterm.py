"""The trainer as PID 1 of its own PID namespace, as in a container: SIGTERM reaches it.

The kernel drops a signal to a namespace's PID 1 that has no handler for it, even one sent from
the parent namespace (the kubelet's, through the container runtime): a trainer without a
SIGTERM handler trains on until the SIGKILL at the end of the grace period. Here the trainer
waits for a rank 0 whose name never resolves (start-up: nothing worth saving), gets SIGTERM from
this namespace and must leave at once with exit code STOPPED.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_api.model import parse_spec, to_json

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode == 0


def child_of(pid: int) -> int | None:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & SIGTERM_BIT)


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare --pid` (root, or user namespaces)")
def test_a_trainer_that_is_pid_1_stops_on_sigterm(tmp_path: Path, make_digits_spec) -> None:  # noqa: ANN001
    config = tmp_path / "config.json"
    config.write_text(json.dumps(to_json(parse_spec(make_digits_spec(training={"steps": 5})))))
    env = {**os.environ, C.ENV_CONFIG: str(config), C.ENV_WORLD_SIZE: "2", C.ENV_RANK: "1",
           C.ENV_LOCAL_RANK: "0", C.ENV_NODE_RANK: "1", C.ENV_NPROC_PER_NODE: "1",
           C.ENV_MASTER_ADDR: "rank-0-not-scheduled-yet.invalid", C.ENV_MASTER_PORT: "29500",
           C.ENV_RENDEZVOUS_TIMEOUT: "600", C.ENV_JOB: "pid1", C.ENV_CHECKPOINT_DIR: str(tmp_path / "ck"),
           C.ENV_RUN_DIR: str(tmp_path / "run"), C.ENV_METRICS_PORT: "0"}  # fmt: skip
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "disttrain_trainer"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        trainer = None
        while time.monotonic() < deadline and proc.poll() is None:
            trainer = child_of(proc.pid)
            if trainer is not None and catches_sigterm(trainer):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the trainer (pid {trainer}, PID 1 of its namespace) never set a SIGTERM handler")
        os.kill(trainer, signal.SIGTERM)  # from the parent namespace, like the container runtime
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exitcodes.STOPPED, out
    assert "stopped on request" in out.strip().splitlines()[-1], out
