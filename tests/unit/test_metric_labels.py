"""Trainer series carry our labels (dtjob, namespace, rank, mode), never Prometheus's target
labels job/instance; and the operator's status.commFraction, read from rank 0's real
exposition, is communication seconds / step seconds."""

from __future__ import annotations

import re

import pytest
from disttrain_api import metric_names as names
from disttrain_operator.observe import parse_prometheus
from disttrain_trainer.telemetry.step_metrics import Metrics, observe_single_step
from prometheus_client import generate_latest


def exposition(steps: list[tuple[float, float]]) -> str:
    """A rank's /metrics after steps of (step seconds, communication seconds)."""
    m = Metrics(job="digits", rank=0, mode="data", port=0, run_dir=None, namespace="ml")
    for i, (step_s, comm_s) in enumerate(steps, 1):
        observe_single_step(m, step=i, loss=1.0, lr=0.1, samples=64, t0=0.0, t1=0.01, t2=step_s,
                                            end=step_s, comm_s=comm_s, comm_bytes=1)
    text = generate_latest(m.registry).decode()
    m.close()
    return text


def test_series_labels_are_ours() -> None:
    samples = [line for line in exposition([(0.2, 0.05)]).splitlines() if line.startswith(names.PREFIX)]
    assert samples
    for line in samples:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        labels.pop("le", None)  # histogram buckets
        assert labels == {names.LABEL_JOB: "digits", names.LABEL_NAMESPACE: "ml", names.LABEL_RANK: "0",
                          names.LABEL_MODE: "data"}, line
    assert "job" not in names.SERIES_LABELS and "instance" not in names.SERIES_LABELS


def test_comm_fraction_from_rank0_scrape() -> None:
    progress = parse_prometheus(exposition([(0.2, 0.05), (0.4, 0.15)]), names.PROGRESS_SERIES)
    assert progress[names.STEP] == 2
    assert names.comm_fraction(progress) == pytest.approx(0.2 / 0.6, abs=1e-4)


def test_no_fraction_before_the_first_step() -> None:
    assert names.comm_fraction(parse_prometheus(exposition([]), names.PROGRESS_SERIES)) is None
