"""/metrics over HTTP from two real ranks, and the step-time decomposition in the JSON-lines log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from disttrain_api import constants as C
from disttrain_api import metric_names as names
from disttrain_api.scaling.hint import propose
from ports import free_ports  # tests/ports.py: each xdist worker's own slice

# Runs one rank with an injected Metrics whose HTTP server outlives training, so the
# test can scrape it after the run; it exits when the test closes its stdin.
RANK_SCRIPT = """
import sys
from disttrain_trainer.process.config import load_config
from disttrain_trainer.telemetry.step_metrics import Metrics
from disttrain_trainer.modes.data.entry import run
cfg = load_config()
m = Metrics(job=cfg.job, rank=cfg.rank, mode=cfg.spec.mode, port=cfg.metrics_port, run_dir=cfg.run_dir)
run(cfg, metrics=m)
print("TRAINED", flush=True)
sys.stdin.readline()
m.close()
"""

SERIES = [
    names.STEP_SECONDS + "_bucket",
    names.STEP_SECONDS + "_count",
    names.COMPUTE_SECONDS + "_total",
    names.DATA_SECONDS + "_total",
    names.IDLE_SECONDS + "_total",
    names.COMM_EXPOSED_SECONDS + "_total",
    names.COMM_BUSY_SECONDS + "_total",
    names.STEP_COMPUTE_SECONDS,
    names.STEP_DATA_SECONDS,
    names.STEP_IDLE_SECONDS,
    names.STEP_COMM_EXPOSED_SECONDS,
    names.STEP_COMM_BUSY_SECONDS,
    names.COMM_EXPOSED_FRACTION,
    names.COMM_BUSY_FRACTION,
    names.IDLE_FRACTION,
    names.SAMPLES_PER_SECOND,
    names.LOSS,
    names.STEP,
    names.LAST_CHECKPOINT_STEP,
    names.CHECKPOINT_STALL_SECONDS,
    names.CHECKPOINT_WRITE_SECONDS,
    names.CHECKPOINT_BYTES,
]
PARTS = ("compute_s", "comm_exposed_s", "data_s", "idle_s")


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
    base = free_ports(2)
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
        text0 = ""
        for rank in range(2):
            text = (
                urllib.request.urlopen(f"http://127.0.0.1:{base + rank}/metrics", timeout=10)
                .read()
                .decode()
            )
            text0 = text0 or text
            for name in SERIES:
                assert f"{name}{{" in text, f"{name} missing from rank {rank}'s /metrics"
            assert 'dtjob="metrics-job"' in text and 'mode="data"' in text
            assert value(text, names.STEP, rank) == 60
            assert value(text, names.STEP_SECONDS + "_count", rank) == 60
            assert value(text, names.COMM_BUSY_SECONDS + "_total", rank) > 0
            assert value(text, names.COMM_EXPOSED_SECONDS + "_total", rank) > 0
            assert value(text, names.IDLE_SECONDS + "_total", rank) > 0
        # Only rank 0 writes checkpoints; its series report the last one completely on disk.
        assert value(text0, names.LAST_CHECKPOINT_STEP, 0) == 60
        assert value(text0, names.CHECKPOINT_BYTES, 0) > 1000
        # Rank 0 serves the forecast's inputs as measured so far (the operator's running hint)
        # and exports the forecast on them; rank 1 publishes none (404, never its metrics instead).
        with urllib.request.urlopen(f"http://127.0.0.1:{base}{names.FORECAST_INPUTS_PATH}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["worldSize"] == 2 and doc["layout"] == "dp=2,pp=1,tp=1" and doc["scaling"]["perStep"]["stepS"] > 0
        assert doc["scaling"]["link"] and doc["scaling"]["buckets"] >= 1
        proposal = propose(doc, world_size=2)
        assert proposal is not None and proposal.current == "dp2" and proposal.efficiency > 0
        assert value(text0, names.FORECAST_EFFICIENCY, 0) == pytest.approx(proposal.efficiency, rel=1e-6)
        assert value(text0, names.FORECAST_GAIN, 0) == pytest.approx(proposal.gain, rel=1e-6)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{base + 1}{names.FORECAST_INPUTS_PATH}", timeout=10)
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
        assert {"step", "loss", "lr", "samples_per_s", "step_s", *PARTS, "comm_busy_s", "comm_exposed_fraction",
                "comm_busy_fraction", "idle_fraction", "time"} <= steps[0].keys()  # fmt: skip
        parts = sum(sum(r[k] for k in PARTS) for r in steps)
        total = sum(r["step_s"] for r in steps)
        assert abs(parts - total) <= 0.10 * total, (parts, total)
        within = [abs(sum(r[k] for k in PARTS) - r["step_s"]) <= 0.1 * r["step_s"] for r in steps]
        assert sum(within) >= 0.9 * len(steps), within
        assert all(r["comm_busy_s"] > 0 and r["compute_s"] > 0 and r["data_s"] > 0 for r in steps)
        assert all(r["comm_exposed_s"] <= r["comm_busy_s"] for r in steps)
        # Rank 0's checkpoint snapshots are idle time on every rank, at exactly those steps; the
        # final checkpoint (it carries the summary) is taken after the last step, outside the loop.
        assert [r["step"] for r in steps if r["idle_s"] > 0] == [25, 50]
    events = [r for r in (run_dir / "metrics-rank0.jsonl").read_text().splitlines() if '"event"' in r]
    assert [json.loads(r)["step"] for r in events if '"checkpoint"' in r] == [25, 50, 60]


def test_exposed_communication_is_less_than_busy_with_several_buckets(trainer, make_digits_spec) -> None:
    # ~0.9 MB of gradients in 0.1 MB buckets: the first buckets' all-reduces run while
    # backward still computes the earlier layers' gradients, so part of busy is overlapped.
    spec = make_digits_spec(
        model={"name": "mlp", "hidden": 256, "layers": 4},
        training={"steps": 30, "logIntervalSteps": 1, "bucketCapMB": 0.1},
        checkpoint={"intervalSteps": 30},
    )
    result = trainer.run(spec, world=2, job="buckets")
    for rank in range(2):
        steps = result.steps_log(rank)[5:]  # after DDP rebuilt its buckets
        busy = sum(r["comm_busy_s"] for r in steps)
        exposed = sum(r["comm_exposed_s"] for r in steps)
        assert 0 < exposed < 0.95 * busy, (rank, exposed, busy)  # measured 0.85 quiet, < 0.8 loaded
    s = result.summary
    assert 0 < s["commExposedFraction"] < s["commBusyFraction"] < 1
