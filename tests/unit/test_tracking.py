"""Experiment tracking in the trainer (disttrain_trainer.tracking): what a record becomes, the
background writer's bounds, and a tracking server that is down or hangs costing the run nothing
but counted errors (a real socket each: one that refuses, one that accepts and never answers)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from disttrain_api import metric_names as names
from disttrain_api.model import parse_spec
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.step_metrics import Metrics
from disttrain_trainer.tracking.background import BackgroundWriter, Final, Scalars
from disttrain_trainer.tracking.scalars import flatten, scalars_of, summary_scalars
from disttrain_trainer.tracking.tracker import params_of, target_for


def test_a_step_record_becomes_the_training_scalars_at_its_step() -> None:
    step, values = scalars_of({"step": 30, "loss": 0.5, "lr": 0.1, "samples_per_s": 100.0, "job_samples_per_s": 400.0,
                               "compute_s": 0.01, "comm_exposed_s": 0.002, "comm_busy_s": 0.004, "data_s": 0.001,
                               "idle_s": 0.0, "step_s": 0.013, "gradient_bytes": 9, "time": 1.0})  # fmt: skip
    assert step == 30
    assert values == {"train/loss": 0.5, "train/learning_rate": 0.1, "train/samples_per_second": 400.0,
                      "time/compute_seconds": 0.01, "time/comm_exposed_seconds": 0.002,
                      "time/comm_busy_seconds": 0.004, "time/data_seconds": 0.001, "time/idle_seconds": 0.0,
                      "time/step_seconds": 0.013}  # fmt: skip


def test_events_rounds_and_versions_keep_their_own_steps() -> None:
    assert scalars_of({"event": "eval", "step": 20, "test_accuracy": 0.9}) == (20, {"eval/test_accuracy": 0.9})
    assert scalars_of({"event": "checkpoint", "step": 20, "write_s": 0.2, "checkpoint_bytes": 10}) == (
        20, {"checkpoint/write_seconds": 0.2, "checkpoint/bytes": 10.0})
    # A federated round is its step; a parameter-server record's step is the parameters' version.
    assert scalars_of({"step": 3, "round": 3, "loss": None, "test_accuracy": 0.7, "clients_answered": 4})[0] == 3
    assert scalars_of({"step": 5, "version": 19, "loss": 1.0}) == (19, {"train/loss": 1.0})
    # Nothing to track, or not the job's view.
    assert scalars_of({"event": "client_round", "step": 1, "loss": 1.0}) is None
    assert scalars_of({"step": 1, "loss": float("nan")}) is None
    assert scalars_of({"loss": 1.0}) is None


def test_the_spec_flattens_into_parameters_and_the_summary_into_numbers(tmp_path: Path) -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": True}) == {"a.b": "1", "a.c": "[1, 2]", "d": "",
                                                                           "e": "True"}  # fmt: skip
    assert summary_scalars({"finalLoss": 0.3, "mode": "data", "ok": True, "steps": 40}) == {
        "summary/finalLoss": 0.3, "summary/steps": 40.0}
    spec = parse_spec({"training": {"steps": 7}, "tracking": {"tensorboard": True}})
    target = target_for(config_for(spec, job="j", run_dir=tmp_path, checkpoint_root=tmp_path))
    assert target is not None
    params = params_of(target)
    assert params["training.steps"] == "7" and params["job"] == "j" and params["tracking.tensorboard"] == "True"
    assert target_for(config_for(parse_spec({}), run_dir=tmp_path, checkpoint_root=tmp_path)) is None


class _Stuck:
    """A backend whose every call blocks until released: a tracking server that hangs."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.written: list[Scalars] = []

    def write(self, items: list[Scalars]) -> None:
        self.release.wait()
        self.written.extend(items)

    def finish(self, final: Final) -> None:
        self.release.wait()


def test_a_hung_backend_never_blocks_the_caller_and_its_losses_are_counted() -> None:
    backend, counted, lines = _Stuck(), [], []
    w = BackgroundWriter(backend, on_error=counted.append, log=lines.append, maxsize=4)
    t0 = time.monotonic()
    for i in range(20):  # one in the backend's hands, 4 queued, the rest dropped
        w.put(Scalars(step=i, values={"x": 1.0}, wall_time=0.0))
    assert time.monotonic() - t0 < 0.5
    time.sleep(0.2)
    errors = w.close(Final(summary=None, step=20, export_dir=None), timeout_s=0.5)
    assert time.monotonic() - t0 < 3.0, "close is bounded"
    assert errors == sum(counted) >= 15
    assert any("queue full" in line for line in lines) and "not delivered in all" in lines[-1]
    backend.release.set()


def _metrics(tmp_path: Path, uri: str, *, timeout_s: int = 1) -> Metrics:
    spec = parse_spec({"tracking": {"mlflow": {"uri": uri, "experiment": "unit", "timeoutSeconds": timeout_s}}})
    cfg = config_for(spec, job="unit", run_dir=tmp_path, checkpoint_root=tmp_path / "ckpt")
    return Metrics(job="unit", rank=0, mode="data", port=0, run_dir=tmp_path, tracking=target_for(cfg))


def _errors(m: Metrics) -> float:
    return m.registry.get_sample_value(names.TRACKING_ERRORS + "_total", {**m.labels, "backend": "mlflow"}) or 0.0


@pytest.mark.parametrize("server", ["down", "hangs"])
def test_a_tracking_server_that_is_down_or_hangs_costs_counted_errors_not_the_run(tmp_path: Path, server: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if server == "hangs":
        listener.listen(64)  # connections complete in the backlog; nothing ever answers
    else:
        listener.close()  # connections refused
    try:
        m = _metrics(tmp_path, f"http://127.0.0.1:{port}")
        t0 = time.monotonic()
        for step in range(1, 6):
            m.write({"step": step, "loss": 1.0 / step})
        assert time.monotonic() - t0 < 0.5, "the loop never waits for the server"
        m.finished({"finalLoss": 0.2, "steps": 5})
        m.close()
        # Bounded: the records in hand (3 attempts of 1 s each), then one try per call until the end.
        assert time.monotonic() - t0 < 20
        assert _errors(m) > 0
        logged = (tmp_path / "metrics-rank0.jsonl").read_text()
        assert '"event": "tracking_errors"' in logged
    finally:
        listener.close()
