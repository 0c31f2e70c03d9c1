"""Tokens/s and MFU figures of the GPT model (disttrain_trainer.telemetry.model_flops)."""

from __future__ import annotations

import torch
from disttrain_api import metric_names as names
from disttrain_api.model import parse_spec
from disttrain_operator.observe import parse_prometheus
from disttrain_trainer.models import GPT
from disttrain_trainer.telemetry.model_flops import (
    gpt_flops_per_token,
    peak_flops,
    throughput_fields,
)
from disttrain_trainer.telemetry.step_metrics import Metrics, Tally
from prometheus_client import generate_latest
from torch import nn


def test_the_flops_formula_counts_every_matmul_weight_of_the_gpt_class() -> None:
    dim, layers, heads, vocab, seq = 96, 3, 4, 71, 40
    model = GPT(vocab, seq, dim, layers, heads, 0.0, "none")
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    attention = 12 * layers * dim * seq  # QK^T and AV, forward and backward
    assert gpt_flops_per_token(dim=dim, layers=layers, vocab=vocab, seq=seq) == 6 * matmul_weights + attention


def test_a_cpu_has_no_peak_so_no_mfu_but_tokens_per_second() -> None:
    spec = parse_spec({"mode": "data", "model": {"name": "gpt", "hidden": 64, "layers": 2, "heads": 2,
                                                 "blockSize": 32}, "data": {"name": "pytext"}})  # fmt: skip
    assert peak_flops(torch.device("cpu"), "bf16") is None
    got = throughput_fields(spec, vocab=50, samples_per_s=10.0, device=torch.device("cpu"), accelerators=2)
    assert got == {"tokensPerS": 320.0,
                   "modelFlopsPerToken": gpt_flops_per_token(dim=64, layers=2, vocab=50, seq=32)}  # fmt: skip


def test_models_other_than_gpt_report_no_token_figures() -> None:
    spec = parse_spec({"mode": "data", "model": {"name": "mlp"}, "data": {"name": "digits"}})
    assert throughput_fields(spec, vocab=10, samples_per_s=100.0, device=torch.device("cpu"), accelerators=1) == {}


def test_the_mfu_gauge_exists_only_once_a_figure_is_known() -> None:
    """An unset gauge would read 0: status.progress.mfu would claim a known 0 on every CPU run."""
    m = Metrics(job="j", rank=0, mode="data", port=0, run_dir=None, namespace="ns")
    try:
        t = Tally()
        t.add_step(t0=0.0, t1=0.1, t2=0.3, end=0.4, exposed_s=0.1, busy_s=0.1, idle_s=0.0, samples=8)
        m.observe_interval(step=1, loss=1.0, lr=0.1, tally=t, gradient_bytes=0)
        assert names.MFU not in parse_prometheus(generate_latest(m.registry).decode(), names.PROGRESS_SERIES)
        m.observe_interval(step=2, loss=1.0, lr=0.1, tally=t, gradient_bytes=0, mfu=0.42)
        assert parse_prometheus(generate_latest(m.registry).decode(), names.PROGRESS_SERIES)[names.MFU] == 0.42
    finally:
        m.close()
