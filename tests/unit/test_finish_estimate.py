"""What rank 0 predicts the run takes after its last step (telemetry/finish_estimate.py), and that
its step count is exported only once training counts steps (start-up stays out of the ETA's rate)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from disttrain_api import constants as C
from disttrain_api import metric_names as names
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.process.precision import make_amp
from disttrain_trainer.run_common import evaluate, probe_eval_seconds
from disttrain_trainer.telemetry.finish_estimate import FinishEstimate, probe_due
from disttrain_trainer.telemetry.step_metrics import Metrics, observe_single_step


def test_the_estimate_adds_the_known_costs_and_scales_the_export_by_the_checkpoint_throughput() -> None:
    f = FinishEstimate()
    assert f.seconds() == 0.0  # nothing measured: nothing guessed
    f.observe_probe(4.0)
    f.observe_probe(3.0)
    f.observe_probe(5.0)  # a probe slowed by something else on the host
    assert f.eval_s == 3.0
    f.eval_s, f.eval_timed = 2.5, True  # a whole evaluation was timed: probes no longer count
    f.observe_probe(1.0)
    f.checkpoint_stall_s, f.checkpoint_write_s, f.checkpoint_bytes = 0.1, 0.6, 300
    assert f.export_s() is None  # the model's size not known yet
    f.export_bytes = 100  # a third of the checkpoint (SGD with momentum, and more)
    assert f.seconds() == 2.5 + 0.1 + 0.6 + 0.2
    assert [i for i in range(1, 300) if probe_due(i)] == [1, 4, 16, 64, 256]


class _PerRow(torch.nn.Module):
    """A model whose forward takes a known time per row (a sleep: no CPU, so the host's load barely
    moves it): what the probe must extrapolate from a few batches to the whole held-out set."""

    def __init__(self, seconds_per_row: float) -> None:
        super().__init__()
        self.seconds_per_row = seconds_per_row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(len(x) * self.seconds_per_row)
        return torch.zeros(len(x), 10)


def test_the_probe_predicts_a_whole_evaluation(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The probe times a few of the 5,000 held-out rows (0.1 s a batch) and scales to all of them."""
    monkeypatch.setenv(C.ENV_DATA_CACHE, str(tmp_path))
    ds = load_dataset(parse_spec({"data": {"name": "synthetic", "syntheticSamples": 25000}}))
    model, amp = _PerRow(200e-6), make_amp("fp32", torch.device("cpu"))
    probe = probe_eval_seconds(model, ds, amp)
    t0 = time.perf_counter()
    evaluate(model, ds, amp)
    whole = time.perf_counter() - t0
    assert whole >= 1.0  # 5,000 rows x 200 us
    assert 0.6 * whole < probe < 1.6 * whole, (probe, whole)
    assert model.training


def test_no_step_count_before_the_first_interval_then_the_finish_estimate_in_every_record(tmp_path: Path) -> None:
    m = Metrics(job="j", rank=0, mode="data", port=0, run_dir=tmp_path)
    assert m.registry.get_sample_value(names.STEP, m.labels) is None  # start-up: nothing to anchor a rate on
    assert m.registry.get_sample_value(names.FINISH_SECONDS, m.labels) is None
    m.observe_eval(0, "test_accuracy", 0.1, seconds=1.5)
    observe_single_step(m, step=10, loss=1.0, lr=0.1, samples=8, t0=0.0, t1=0.001, t2=0.01, end=0.011, comm_s=0.0,
                        comm_bytes=0)  # fmt: skip
    assert m.registry.get_sample_value(names.STEP, m.labels) == 10
    assert m.registry.get_sample_value(names.FINISH_SECONDS, m.labels) == 1.5
    m.observe_checkpoint_stall(10, 0.25)
    m.observe_checkpoint(10, 0.5, 1000)
    observe_single_step(m, step=20, loss=1.0, lr=0.1, samples=8, t0=0.0, t1=0.001, t2=0.01, end=0.011, comm_s=0.0,
                        comm_bytes=0)  # fmt: skip
    m.close()
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    steps = [r for r in records if "event" not in r]
    assert [r["finish_s"] for r in steps] == [1.5, 2.25]
    assert next(r for r in records if r.get("event") == "eval")["eval_s"] == 1.5
