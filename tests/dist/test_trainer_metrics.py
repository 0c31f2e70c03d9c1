"""/metrics over HTTP from two real ranks, and the step-time decomposition in the JSON-lines log."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

from disttrain_api import constants as C

# Runs one rank with an injected Metrics whose HTTP server outlives training, so the
# test can scrape it after the run; it exits when the test closes its stdin.
RANK_SCRIPT = """
import sys
from disttrain_trainer.config import load_config
from disttrain_trainer.metrics import Metrics
from disttrain_trainer.train import run
cfg = load_config()
m = Metrics(job=cfg.job, rank=cfg.rank, mode=cfg.spec.mode, port=cfg.metrics_port, run_dir=cfg.run_dir)
run(cfg, metrics=m)
print("TRAINED", flush=True)
sys.stdin.readline()
m.close()
"""

SERIES = [
    "disttrain_step_seconds_bucket",
    "disttrain_step_seconds_count",
    "disttrain_compute_seconds_total",
    "disttrain_communication_seconds_total",
    "disttrain_data_seconds_total",
    "disttrain_step_compute_seconds",
    "disttrain_step_communication_seconds",
    "disttrain_step_data_seconds",
    "disttrain_samples_per_second",
    "disttrain_loss",
    "disttrain_step",
    "disttrain_last_checkpoint_step",
    "disttrain_checkpoint_seconds",
    "disttrain_checkpoint_bytes",
    "disttrain_communication_fraction",
]


def two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
                return int(base)
    raise RuntimeError("no two consecutive free ports")


def value(text: str, name: str, rank: int) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'rank="{rank}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for rank {rank} not exposed")


def test_metrics_endpoint_and_time_decomposition(trainer, make_digits_spec) -> None:
    spec = make_digits_spec(
        training={"steps": 60, "logIntervalSteps": 1}, checkpoint={"intervalSteps": 25}
    )
    config = trainer.spec_file(spec, "metrics")
    run_dir = trainer.tmp / "runs" / "metrics"
    base = two_free_ports()
    master = base + 2 if base + 2 < 65535 else base - 1
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            C.ENV_CONFIG: str(config), C.ENV_WORLD_SIZE: "2", C.ENV_RANK: str(rank), C.ENV_LOCAL_RANK: str(rank),
            C.ENV_NPROC_PER_NODE: "2", C.ENV_MASTER_ADDR: "127.0.0.1", C.ENV_MASTER_PORT: str(master),
            C.ENV_JOB: "metrics-job", C.ENV_CHECKPOINT_DIR: str(trainer.ckpt_root), C.ENV_RUN_DIR: str(run_dir),
            C.ENV_METRICS_PORT: str(base), C.ENV_DATA_CACHE: str(trainer.data_cache), "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    try:
        for p in procs:
            line = p.stdout.readline()  # type: ignore[union-attr]
            while line and "TRAINED" not in line:
                line = p.stdout.readline()  # type: ignore[union-attr]
            assert "TRAINED" in line, f"rank exited with {p.wait(timeout=30)}: {p.stdout.read()}"  # type: ignore[union-attr]
        for rank in range(2):
            text = (
                urllib.request.urlopen(f"http://127.0.0.1:{base + rank}/metrics", timeout=10)
                .read()
                .decode()
            )
            for name in SERIES:
                assert f"{name}{{" in text, f"{name} missing from rank {rank}'s /metrics"
            assert 'dtjob="metrics-job"' in text and 'mode="data"' in text
            assert value(text, "disttrain_step", rank) == 60
            assert value(text, "disttrain_last_checkpoint_step", rank) == 60
            assert value(text, "disttrain_step_seconds_count", rank) == 60
            assert value(text, "disttrain_communication_seconds_total", rank) > 0
            assert value(text, "disttrain_checkpoint_bytes", rank) > 1000
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()  # type: ignore[union-attr]
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    assert [p.returncode for p in procs] == [0, 0]

    for rank in range(2):
        recs = [
            json.loads(x) for x in (run_dir / f"metrics-rank{rank}.jsonl").read_text().splitlines()
        ]
        steps = [r for r in recs if "event" not in r]
        assert [r["step"] for r in steps] == list(range(1, 61))
        assert {"step", "loss", "lr", "samples_per_s", "step_s", "compute_s", "comm_s", "data_s",
                "comm_fraction", "time"} <= steps[0].keys()  # fmt: skip
        parts = sum(r["compute_s"] + r["comm_s"] + r["data_s"] for r in steps)
        total = sum(r["step_s"] for r in steps)
        assert abs(parts - total) <= 0.10 * total, (parts, total)
        within = [
            abs(r["compute_s"] + r["comm_s"] + r["data_s"] - r["step_s"]) <= 0.1 * r["step_s"]
            for r in steps
        ]
        assert sum(within) >= 0.9 * len(steps), within
        assert all(r["comm_s"] > 0 and r["compute_s"] > 0 and r["data_s"] > 0 for r in steps)
        assert [r["step"] for r in recs if r.get("event") == "checkpoint"] == [25, 50, 60]
