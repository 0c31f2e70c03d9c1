"""The large-batch lr rule (Goyal et al.): scaling, gradual warmup, decay — checked at chosen steps;
the optimizers and the kernel that updates them."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from disttrain_api.model import OptimizerSpec
from disttrain_trainer.optim import (
    build_optimizer,
    build_scheduler,
    fused_supported,
    lr_at,
    peak_lr,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


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


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_plain_parameters_get_the_fused_kernel_and_train_like_the_default(name: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    twin = copy.deepcopy(model)
    fused = build_optimizer(model.parameters(), opt(name=name, momentum=0.9, weight_decay=1e-4), 256)
    g = fused.param_groups[0]
    default = type(fused)(twin.parameters(), lr=g["lr"], weight_decay=g["weight_decay"],
                          **({"momentum": 0.9} if name == "sgd" else {}))  # fmt: skip
    assert g["fused"] is True and not default.param_groups[0]["fused"]
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(20):
        for m, o in ((model, fused), (twin, default)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_a_loaded_state_keeps_the_kernel_chosen_for_the_parameters() -> None:
    p = torch.nn.Parameter(torch.ones(4))
    fused = build_optimizer([p], opt(name="adamw"), 256)
    default = torch.optim.AdamW([torch.nn.Parameter(torch.ones(4))], lr=1e-3)
    default.zero_grad()
    default.param_groups[0]["params"][0].sum().backward()
    default.step()
    saved = default.state_dict()
    fused.load_state_dict(saved)
    assert fused.param_groups[0]["fused"] is True
    assert saved["param_groups"][0]["fused"] is None  # the caller's dict is left as it was
    p.sum().backward()
    fused.step()  # the loaded step count works with the fused kernel
    assert int(fused.state[p]["step"]) == 2
    back = torch.optim.AdamW([torch.nn.Parameter(torch.ones(4))], lr=1e-3)
    back.load_state_dict(fused.state_dict())  # and a default optimizer loads a fused one's state
    assert int(back.state[back.param_groups[0]["params"][0]]["step"]) == 2


def test_fused_only_where_every_parameter_has_a_fused_kernel(tmp_path: Path) -> None:
    assert fused_supported([torch.nn.Parameter(torch.zeros(2)), torch.zeros(3)])
    assert not fused_supported([torch.nn.Parameter(torch.zeros(2)), torch.zeros(2, dtype=torch.int64)])
    assert not fused_supported([])
    # Sharded (DTensor) parameters keep the default kernel: fused SGD has no DTensor rule.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = torch.nn.Parameter(distribute_tensor(torch.zeros(4), mesh, [Shard(0)]))
        assert not fused_supported([sharded])
        optimizer = build_optimizer([sharded], opt(name="sgd", momentum=0.9), 256)
        assert not optimizer.param_groups[0]["fused"]
        sharded.grad = distribute_tensor(torch.ones(4), mesh, [Shard(0)])
        optimizer.step()
        # A loaded state (here a fused optimizer's) leaves both flags unset, so torch keeps
        # choosing its default kernel (foreach on CUDA), not its slowest per-parameter loop.
        fused = build_optimizer([torch.nn.Parameter(torch.zeros(4))], opt(name="sgd", momentum=0.9), 256)
        assert fused.param_groups[0]["fused"] is True
        optimizer.load_state_dict(fused.state_dict())
        assert optimizer.param_groups[0]["fused"] is None and optimizer.param_groups[0]["foreach"] is None
    finally:
        dist.destroy_process_group()
