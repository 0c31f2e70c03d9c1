"""The trainer's forecast inputs: model facts, the steady-state tally, the termination message's size."""

from __future__ import annotations

import json

import pytest
import torch
from disttrain_trainer.models import GPT, MLP
from disttrain_trainer.parallel.tensor import megatron_bytes_per_step
from disttrain_trainer.telemetry import scaling_record as sr
from disttrain_trainer.telemetry.step_metrics import Tally


def test_gpt_facts_follow_megatron_and_powersgd_shapes() -> None:
    gpt = GPT(vocab=64, dim=32, layers=3, heads=4, block_size=16, dropout=0.0, act_ckpt="none")
    f = sr.model_facts(gpt, batch=8, precision="fp32")
    assert f["parameters"] == sum(p.numel() for p in gpt.parameters())
    assert f["blocks"] == 3 + 2  # embedding, the blocks, (ln_f, head)
    assert f["activationBytes"] == 8 * 16 * 32 * 4
    assert f["tensorLimit"] == 4
    assert f["tensorComm"]["bytes"] == megatron_bytes_per_step(batch=8, seq=16, hidden=32, layers=3, elem=4)
    # PowerSGD: a matrix of n x m sends (n + m) per rank of its factors, a vector goes as it is
    low = sum((p.shape[0] + p.numel() // p.shape[0]) * 4 for p in gpt.parameters() if p.dim() >= 2)
    assert f["lowRank"] == {"bytesPerRank": low, "uncompressedBytes": sum(p.numel() * 4 for p in gpt.parameters() if p.dim() < 2)}


def test_mlp_facts() -> None:
    mlp = MLP(64, 32, 2, 10, 0.0, "none")  # stem 64->32, one block 32->32, head 32->10
    f = sr.model_facts(mlp, batch=16, precision="bf16")
    assert f["blocks"] == 3 and f["tensorLimit"] == 32
    assert f["activationBytes"] == 16 * 32 * 2
    # pairs (stem col, block row), head replicated: forward 1 all-reduce, backward none (the input needs no gradient)
    assert f["tensorComm"]["count"] == 1


def test_steady_state_leaves_the_first_interval_out() -> None:
    rec = sr.ScalingRecorder()
    totals = Tally()
    for i, step_s in enumerate((1.0, 0.1, 0.1)):  # the first interval is slow: warm-up
        t = Tally()
        t.add_step(t0=0.0, t1=0.0, t2=step_s, end=step_s, exposed_s=0.0, busy_s=0.0, idle_s=0.0, samples=1)
        totals.merge(t)
        rec.interval(t)
        assert rec.steady.steps == i
    assert rec.per_step(totals)["stepS"] == pytest.approx(0.1)
    assert sr.ScalingRecorder().per_step(totals)["stepS"] == pytest.approx(0.4)  # no steady interval: the whole run


def test_probe_needs_two_ranks() -> None:
    assert sr.probe_link(torch.device("cpu"), 1) is None


def test_termination_message_stays_within_the_kubelets_limit() -> None:
    blocks = 600  # the block times alone exceed the limit
    summary = {"steps": 10, "finalLoss": 1.0, "scaling": {
        "perStep": {"stepS": 0.1}, "link": {"alphaS": 1e-5, "bytes": [1] * 4, "seconds": [0.1] * 4},
        "pipeline": {"blockSeconds": [0.0123] * blocks, "blockOutBytes": [123456] * blocks, "stageComputeS": [0.1]}}}  # fmt: skip
    assert len(json.dumps(summary)) > sr.TERMINATION_MESSAGE_LIMIT
    text = sr.termination_message(summary)
    assert len(text.encode()) <= sr.TERMINATION_MESSAGE_LIMIT
    kept = json.loads(text)
    assert kept["steps"] == 10 and kept["scaling"]["perStep"] == {"stepS": 0.1}
    assert "blockSeconds" not in kept["scaling"]["pipeline"] and "bytes" not in kept["scaling"]["link"]
    assert summary["scaling"]["pipeline"]["blockSeconds"]  # the summary itself (summary.json) is untouched
    small = {"steps": 1, "scaling": {"perStep": {"stepS": 0.1}}}
    assert json.loads(sr.termination_message(small)) == small
