"""The large-batch lr rule (Goyal et al.): scaling, gradual warmup, decay — checked at chosen steps."""

from __future__ import annotations

import math

import pytest
import torch
from disttrain_api.model import OptimizerSpec
from disttrain_trainer.optim import build_optimizer, build_scheduler, lr_at, peak_lr


def opt(**kw) -> OptimizerSpec:  # noqa: ANN003
    base = {
        "name": "sgd",
        "lr": 0.1,
        "base_batch_size": 256,
        "warmup_steps": 10,
        "decay": "cosine",
        "min_lr_ratio": 0.0,
    }
    return OptimizerSpec(**{**base, **kw})


def test_linear_and_sqrt_scaling_of_the_peak() -> None:
    assert peak_lr(opt(scale_lr="linear"), 1024) == pytest.approx(0.4)
    assert peak_lr(opt(scale_lr="sqrt"), 1024) == pytest.approx(0.2)
    assert peak_lr(opt(scale_lr="none"), 1024) == pytest.approx(0.1)
    assert peak_lr(opt(scale_lr="linear"), 128) == pytest.approx(0.05)


def test_gradual_warmup_goes_from_base_lr_to_scaled_lr() -> None:
    o = opt(scale_lr="linear", warmup_steps=10)
    b = 1024  # k = 4: warmup from 0.1 to 0.4, adding 0.03 per step
    assert lr_at(0, opt=o, batch_size=b, total_steps=100) == pytest.approx(0.1)
    assert lr_at(5, opt=o, batch_size=b, total_steps=100) == pytest.approx(0.25)
    assert lr_at(9, opt=o, batch_size=b, total_steps=100) == pytest.approx(0.37)
    assert lr_at(10, opt=o, batch_size=b, total_steps=100) == pytest.approx(0.4)


def test_warmup_without_scaling_starts_from_peak_over_warmup_steps() -> None:
    o = opt(scale_lr="none", warmup_steps=4)
    assert [lr_at(s, opt=o, batch_size=256, total_steps=20) for s in range(5)] == pytest.approx(
        [0.025, 0.04375, 0.0625, 0.08125, 0.1]
    )


def test_decays_to_min_lr_ratio() -> None:
    b, total = 512, 110
    cos = opt(scale_lr="linear", decay="cosine", min_lr_ratio=0.1)  # peak 0.2, floor 0.02
    assert lr_at(60, opt=cos, batch_size=b, total_steps=total) == pytest.approx(0.02 + 0.18 * 0.5)
    assert lr_at(110, opt=cos, batch_size=b, total_steps=total) == pytest.approx(0.02)
    mid = 0.02 + 0.18 * 0.5 * (1 + math.cos(math.pi * 0.25))
    assert lr_at(35, opt=cos, batch_size=b, total_steps=total) == pytest.approx(mid)
    lin = opt(scale_lr="linear", decay="linear", min_lr_ratio=0.0)
    assert lr_at(60, opt=lin, batch_size=b, total_steps=total) == pytest.approx(0.1)
    step = opt(scale_lr="linear", decay="step", min_lr_ratio=0.0)
    assert lr_at(59, opt=step, batch_size=b, total_steps=total) == pytest.approx(0.2)
    assert lr_at(60, opt=step, batch_size=b, total_steps=total) == pytest.approx(0.02)
    assert lr_at(85, opt=step, batch_size=b, total_steps=total) == pytest.approx(0.002)
    none = opt(scale_lr="linear", decay="none")
    assert lr_at(100, opt=none, batch_size=b, total_steps=total) == pytest.approx(0.2)


def test_scheduler_applies_the_rule_to_the_optimizer() -> None:
    o = opt(scale_lr="linear", warmup_steps=10, decay="cosine", min_lr_ratio=0.05)
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer = build_optimizer([p], o, 1024)
    sched = build_scheduler(optimizer, o, 1024, 50)
    seen = []
    for _ in range(50):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        sched.step()
    assert seen == pytest.approx(
        [lr_at(s, opt=o, batch_size=1024, total_steps=50) for s in range(50)]
    )


@pytest.mark.parametrize(
    "name,cls", [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)]
)
def test_optimizer_names(name: str, cls: type) -> None:
    assert isinstance(
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], opt(name=name), 256), cls
    )
