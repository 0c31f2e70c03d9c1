"""Federated clients ride out an aggregator that is killed mid-round and started again.

Real processes on 127.0.0.1 (`python -m disttrain_trainer` with the env contract `disttrain
local` gives them): one aggregator and two client processes, secure aggregation on. Client
process 1 is frozen (SIGSTOP), so the next rounds wait out the key stage for its clients while
client process 0's clients sit in their AdvertiseKeys call; the aggregator is SIGKILLed right
there, started again from its checkpoint, and process 1 thawed. Every client process must ride
the restart out with its backoff (no crash: in a cluster a crashed client pod is counted as a
failure) and the run must finish all its rounds with the resumed aggregator.

While the aggregator is down, a checkpoint is planted in its directory, as a pod with write access
would plant it: `step-99999999/` whose state.pt is a pickle that creates a file when unpickled,
with a meta.json and a fence claim forged to match. The restarted aggregator must neither run it
nor resume from it, and must say why.
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
import torch
from disttrain_api import model as api
from disttrain_trainer.launcher import env as envmod
from disttrain_trainer.launcher import identity

pytestmark = pytest.mark.dist

ROUNDS = 5
SPEC = {
    "mode": "federated", "workers": {"replicas": 2}, "model": {"name": "mlp", "hidden": 16, "layers": 1},
    "data": {"name": "digits", "batchSize": 32}, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    # t = 3 of 5: process 0's clients alone (0, 2, 4) can finish a round while process 1 is frozen, after
    # the key stage waited roundTimeoutSeconds for clients 1 and 3.
    "federated": {"clients": 5, "clientsPerRound": 5, "minAnsweredClients": 3, "rounds": ROUNDS,
                  "secureAggregation": True, "roundTimeoutSeconds": 6, "partition": {"kind": "iid"}},
}  # fmt: skip


class Payload:
    """Unpickled by a loader that can run code, this creates `target`."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, ...]:
        return (Path.write_text, (self.target, "code ran"))


def plant(root: Path, target: Path) -> None:
    """step-99999999 with a payload state.pt, a meta.json with its true manifest, and a claim after the
    newest one that lists it as published: the next claim carries it over as a checkpoint to pick."""
    step = root / "step-99999999"
    step.mkdir()
    torch.save({"model": Payload(target), "round": 99_999_999}, step / "state.pt")
    claims = sorted(int(p.name) for p in (root / ".fence").iterdir() if p.name.isdigit())
    record = {"jobUID": "", "attempt": 0, "generation": claims[-1] + 1}
    published = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
    (root / ".fence" / f"{claims[-1] + 1:012d}").write_text(json.dumps({**record, "published": published}))
    (step / "meta.json").write_text(json.dumps({"step": 99_999_999, "world_size": 1, "format": 1, "writer": record,
                                                "files": {"state.pt": (step / "state.pt").stat().st_size}}))


def _rounds(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics-rank0.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if "round" in r]


def _wait(what: str, cond, procs: dict[str, subprocess.Popen], timeout: float = 120.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not cond():
        dead = {k: p.returncode for k, p in procs.items() if p.poll() is not None}
        assert not dead, f"while waiting for {what}: exited {dead}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_clients_ride_out_an_aggregator_killed_mid_round(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = run_dir / "config.json"
    config.write_text(json.dumps(api.to_json(api.parse_spec(SPEC))))
    gang = envmod.GangEnv(
        job="fedrestart", world_size=2, procs_per_worker=1, master_port=envmod.reserve_ports(1)[0],
        config_path=config, run_dir=run_dir, checkpoint_dir=tmp_path / "checkpoints",
        termination_log=run_dir / "termination-log", restart_attempt=0,
        device=envmod.DevicePlan(device="cpu", visible=None), threads=1,
    )  # fmt: skip
    slots = envmod.gang_slots(2, 1)
    envs = [(s, envmod.process_env(os.environ, gang, s, 0)) for s in slots]
    envs = envmod.federated_envs(envs, server_port=envmod.reserve_ports(1)[0], metrics_port=0)
    # The credentials `disttrain local` mints: without them the trainer refuses federated mode.
    (_, agg_env), (_, c0_env), (_, c1_env) = identity.provision(run_dir, api.parse_spec(SPEC), envs)
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("aggregator", "aggregator2", "client0", "client1")}  # noqa: SIM115

    def start(name: str, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "disttrain_trainer"], env=env, stdout=logs[name],
                                stderr=subprocess.STDOUT)  # fmt: skip

    procs = {"aggregator": start("aggregator", agg_env), "client0": start("client0", c0_env),
             "client1": start("client1", c1_env)}  # fmt: skip
    try:
        _wait("round 1", lambda: len(_rounds(run_dir)) >= 1, procs)
        os.kill(procs["client1"].pid, signal.SIGSTOP)
        frozen_at = len(_rounds(run_dir))
        # A round played without process 1 (its key stage waited out the timeout): the next one
        # starts at once, and process 0's clients advertise their keys and wait for the stage to close.
        _wait("a round without process 1", lambda: len(_rounds(run_dir)) > frozen_at, procs)
        done_before = len(_rounds(run_dir))
        assert done_before < ROUNDS
        time.sleep(2.5)  # well inside the key stage's 6 s wait for the frozen clients
        procs["aggregator"].kill()
        procs["aggregator"].wait()
        plant(tmp_path / "checkpoints" / "fedrestart", tmp_path / "pwned")
        time.sleep(1.0)  # the clients find it gone and back off
        procs["aggregator"] = start("aggregator2", agg_env)  # same env: same checkpoint dir, same token key
        os.kill(procs["client1"].pid, signal.SIGCONT)
        for name in ("client0", "client1", "aggregator"):  # a crashed client shows first
            p = procs[name]
            p.wait(timeout=180)
            log = (tmp_path / f"{'aggregator2' if name == 'aggregator' else name}.log").read_text()
            assert p.returncode == 0, f"{name} exited {p.returncode}:\n{log[-3000:]}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
        for f in logs.values():
            f.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == ROUNDS and summary["resumedFromStep"] == done_before, summary
    assert not (tmp_path / "pwned").exists(), "the planted checkpoint's pickle ran in the aggregator"
    log = (tmp_path / "aggregator2.log").read_text()
    assert "step-99999999 is unreadable" in log and "refused unread" in log, log[-3000:]
    assert [r["round"] for r in _rounds(run_dir)] == list(range(1, ROUNDS + 1))
    # Process 0's clients were in a secure stage when the aggregator died, and retried.
    assert "AdvertiseKeys: UNAVAILABLE" in (tmp_path / "client0.log").read_text()
