"""The GPT example on CUDA (NCCL, world size 1) with fp16 (GradScaler) and bf16; skipped without a GPU."""

from __future__ import annotations

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
        "training": {"steps": 200, "precision": precision, "logIntervalSteps": 10},
        "checkpoint": {"intervalSteps": 200},
    }
    res = trainer.run(spec, world=1, job=f"gpt-{precision}", env={C.ENV_DEVICE: "cuda"})
    s = res.summary
    assert s["backend"] == "nccl" and s["device"] == "cuda" and s["precision"] == precision
    assert s["tokensPerS"] == pytest.approx(s["samplesPerS"] * 128)
    if any(g in torch.cuda.get_device_name() for g in ("H100", "H200", "A100")):
        assert 0.0 < s["mfu"] < 1.0, s  # the datasheet peak of a GPU that model_flops knows
    # The loop waits for the GPU twice per log interval; the categories still add up to the step
    # time and every interval's communication was measured on its last step.
    parts = ("computeFraction", "dataFraction", "commExposedFraction", "idleFraction")
    assert sum(s[k] for k in parts) == pytest.approx(1.0, abs=0.02), s
    assert all(r["comm_busy_s"] > 0 for r in res.steps_log(0))
    losses = [r["loss"] for r in res.steps_log(0)]
    assert losses[-1] < 0.7 * losses[0], losses
    print(
        f"GPT {precision} on CUDA: {s['tokensPerS']:.0f} tokens/s, MFU {s.get('mfu')}, "
        f"val_loss {s['valLoss']:.3f}"
    )
