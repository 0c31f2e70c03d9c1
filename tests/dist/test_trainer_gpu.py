"""The GPT example on CUDA (NCCL, world size 1) with fp16 (GradScaler) and bf16; skipped without a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from disttrain_api import constants as C

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gpt_on_cuda_nccl_mixed_precision(trainer, precision: str) -> None:
    spec = {
        "mode": "data",
        "workers": {"replicas": 1, "resources": {"gpus": 1}},
        "model": {"name": "gpt", "hidden": 256, "layers": 4, "heads": 4, "blockSize": 128},
        "data": {"name": "pytext", "batchSize": 64, "seed": 0},
        "optimizer": {
            "name": "adamw",
            "lr": 1e-3,
            "baseBatchSize": 64,
            "warmupSteps": 20,
            "weightDecay": 0.01,
        },
        "training": {"steps": 200, "precision": precision, "logIntervalSteps": 10, "evalIntervalSteps": 50},
        "checkpoint": {"intervalSteps": 100},
    }
    res = trainer.run(spec, world=1, job=f"gpt-{precision}", env={C.ENV_DEVICE: "cuda"})
    s = res.summary
    assert s["backend"] == "nccl" and s["device"] == "cuda" and s["precision"] == precision
    assert s["tokensPerS"] == pytest.approx(s["samplesPerS"] * 128)
    if any(g in torch.cuda.get_device_name() for g in ("H100", "H200", "A100")):
        assert 0.0 < s["mfu"] < 1.0, s  # the datasheet peak of a GPU that model_flops knows
    check_time_categories(s, res.steps_log(0), alone={50, 100, 150})
    losses = [r["loss"] for r in res.steps_log(0)]
    assert losses[-1] < 0.7 * losses[0], losses
    print(
        f"GPT {precision} on CUDA: {s['tokensPerS']:.0f} tokens/s, MFU {s.get('mfu')}, "
        f"val_loss {s['valLoss']:.3f}"
    )


def check_time_categories(summary: dict[str, Any], intervals: list[dict[str, Any]], *, alone: set[int]) -> None:
    """Each category is measured on its own (train.py), so their sum is a check, not an identity:
    data = the batch's fetch and copy, compute + exposed communication = the step's work (DDP's
    timer splits it), idle = rank 0 working alone (evaluation, checkpoint snapshot) up to the
    barrier, timed around that and nothing else. The loop's own bookkeeping is in no category.

    `alone`: the steps after which rank 0 evaluated or checkpointed."""
    for r in intervals:
        first = r["step"] - r["steps"] + 1
        # Idle is not the rest of the step: zero where nobody waited for rank 0, positive where it did.
        assert (r["idle_s"] > 0) == any(first <= a <= r["step"] for a in alone), r
        parts = r["data_s"] + r["compute_s"] + r["comm_exposed_s"] + r["idle_s"]
        assert parts <= r["step_s"] * (1 + 1e-9), r  # nothing counted twice
        assert parts >= 0.9 * r["step_s"], r  # nothing of substance left out (the GPU's time included)
        assert r["comm_busy_s"] > 0, r  # every interval's communication measured on its last step
    fractions = sum(summary[k] for k in ("computeFraction", "dataFraction", "commExposedFraction", "idleFraction"))
    assert 0.9 <= fractions <= 1.0 + 1e-9, summary


def _float8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _compile_spec(**training: Any) -> dict[str, Any]:
    # 384 wide: the qkv (1152 outputs) and MLP-up (1536) projections pass the float8 filter.
    return {
        "mode": "data",
        "workers": {"replicas": 1, "resources": {"gpus": 1}},
        "parallelism": {"dataStrategy": "fsdp"},
        "model": {"name": "gpt", "hidden": 384, "layers": 4, "heads": 6, "blockSize": 128},
        "data": {"name": "pytext", "batchSize": 64, "seed": 0},
        "optimizer": {"name": "adamw", "lr": 1e-3, "baseBatchSize": 64, "warmupSteps": 20},
        "training": {"steps": 120, "precision": "bf16", "logIntervalSteps": 20, **training},
        "checkpoint": {"intervalSteps": 120},
    }


@pytest.mark.skipif(not _float8_gpu(), reason="needs a CUDA GPU of compute capability 8.9+")
def test_gpt_compiled_with_float8_under_fsdp_trains_and_reports_steady_state(trainer) -> None:  # noqa: ANN001
    res = trainer.run(_compile_spec(compile=True, float8=True), world=1, job="gpt-fp8", env={C.ENV_DEVICE: "cuda"})
    s = res.summary
    assert s["compile"] == "default" and s["compileS"] > 0 and s["recompiles"] == 0, s
    assert s["steadyTokensPerS"] > s["tokensPerS"] > 0, s
    assert len(s["peakMemoryBytesPerRank"]) == 1 and s["peakMemoryBytesPerRank"][0] > 0
    losses = [r["loss"] for r in res.steps_log(0)]
    assert losses[-1] < 0.8 * losses[0], losses
    print(f"GPT bf16 compiled + float8 (FSDP): {s['steadyTokensPerS']:.0f} tokens/s steady, "
          f"{s['tokensPerS']:.0f} whole run, compile {s['compileS']:.1f} s, MFU {s.get('steadyMfu')}")


@pytest.mark.skipif(not torch.cuda.is_available() or _float8_gpu(), reason="needs a CUDA GPU without float8 (< 8.9)")
def test_float8_on_a_gpu_without_float8_is_refused_naming_it(trainer) -> None:  # noqa: ANN001
    res = trainer.run(_compile_spec(float8=True), world=1, job="gpt-fp8-old", env={C.ENV_DEVICE: "cuda"},
                      expect_ok=False)  # fmt: skip
    assert res.returncodes == [2] and torch.cuda.get_device_name() in res.outputs[0], res.outputs
