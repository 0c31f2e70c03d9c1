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
    losses = [r["loss"] for r in res.steps_log(0)]
    assert losses[-1] < 0.7 * losses[0], losses
    print(
        f"GPT {precision} on CUDA: {s['samplesPerS']:.0f} samples/s, val_loss {s['valLoss']:.3f}"
    )
