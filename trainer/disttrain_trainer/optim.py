"""Optimizers and the large-batch learning-rate rule (Goyal et al. 2017).

peak lr = optimizer.lr x k, with k = B / baseBatchSize (linear), sqrt of that
(sqrt) or 1 (none). During `warmupSteps` the lr rises linearly from lr (= peak/k,
the small-batch rate, when k > 1; from peak/warmupSteps otherwise) to the peak;
then it decays over the remaining steps to minLRRatio x peak: cosine, linear,
step (x0.1 at 50% and 75% of the decay phase, floored at the minimum) or none.
`lr_factor` is a pure function of the step so tests can check any step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from disttrain_api.model import OptimizerSpec
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


def scale_factor(opt: OptimizerSpec, batch_size: int) -> float:
    ratio = batch_size / opt.base_batch_size
    if opt.scale_lr == "linear":
        return ratio
    if opt.scale_lr == "sqrt":
        return math.sqrt(ratio)
    return 1.0


def peak_lr(opt: OptimizerSpec, batch_size: int) -> float:
    return opt.lr * scale_factor(opt, batch_size)


def lr_factor(step: int, *, opt: OptimizerSpec, batch_size: int, total_steps: int) -> float:
    """lr at optimizer step `step` (0-based) as a fraction of the peak lr."""
    warm = opt.warmup_steps
    if step < warm:
        k = scale_factor(opt, batch_size)
        start = 1.0 / k if k > 1.0 else 1.0 / warm
        return start + (1.0 - start) * step / warm
    floor = opt.min_lr_ratio
    progress = min(1.0, max(0.0, (step - warm) / max(1, total_steps - warm)))
    if opt.decay == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if opt.decay == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    if opt.decay == "step":
        drops = (progress >= 0.5) + (progress >= 0.75)
        return max(floor, 0.1**drops)
    return 1.0


def lr_at(step: int, *, opt: OptimizerSpec, batch_size: int, total_steps: int) -> float:
    return peak_lr(opt, batch_size) * lr_factor(
        step, opt=opt, batch_size=batch_size, total_steps=total_steps
    )


def build_optimizer(params: Iterable[torch.Tensor], opt: OptimizerSpec, batch_size: int) -> torch.optim.Optimizer:
    """The spec's optimizer over `params`, with torch's fused kernel wherever every parameter allows it."""
    params = list(params)
    lr = peak_lr(opt, batch_size)
    # None, not False, elsewhere: torch then picks its default kernel (foreach on CUDA).
    fused = True if fused_supported(params) else None
    if opt.name == "sgd":
        built: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr, momentum=opt.momentum,
                                                       weight_decay=opt.weight_decay, fused=fused)  # fmt: skip
    elif opt.name == "adam":
        built = torch.optim.Adam(params, lr=lr, weight_decay=opt.weight_decay, fused=fused)
    elif opt.name == "adamw":
        built = torch.optim.AdamW(params, lr=lr, weight_decay=opt.weight_decay, fused=fused)
    else:
        raise ValueError(f"optimizer.name {opt.name!r} must be sgd, adam or adamw")
    built.register_load_state_dict_pre_hook(_keep_implementation)
    return built


def fused_supported(params: Sequence[torch.Tensor]) -> bool:
    """Whether the loop takes torch's fused optimizer kernel for `params`: plain floating-point
    tensors on a CPU.

    On a CPU torch's default is a Python loop of several ops per parameter; the fused kernel
    updates all of them in one call. On the digits MLP (6 tensors) an SGD step with momentum and
    weight decay takes 29 us fused against 78 us, 6% of a step (benchmarks/README.md). On CUDA
    torch's default multi-tensor (foreach) kernels already update every parameter in a few
    launches, and stay. Sharded (DTensor) parameters keep the default: fused SGD has no DTensor rule.
    """
    return bool(params) and all(
        type(p) in (torch.Tensor, nn.Parameter) and torch.is_floating_point(p) and p.device.type == "cpu"
        for p in params
    )


def _keep_implementation(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any] | None:
    """A saved state dict carries the saving optimizer's `fused`/`foreach` flags, and loading it
    would switch the kernel (a checkpoint may come from another layout or version). The flags
    this optimizer was built with replace them before the load, so they also decide where torch
    puts the loaded state (a fused Adam keeps its step counts on the parameters' device)."""
    own, saved = optimizer.param_groups, state["param_groups"]
    if len(own) != len(saved):
        return None  # torch's load rejects the state with its own message
    groups = [{**g, "fused": o["fused"], "foreach": o["foreach"]} for o, g in zip(own, saved, strict=True)]
    return {**state, "param_groups": groups}


def build_scheduler(
    optimizer: torch.optim.Optimizer, opt: OptimizerSpec, batch_size: int, total_steps: int
) -> LambdaLR:
    return LambdaLR(
        optimizer, lambda s: lr_factor(s, opt=opt, batch_size=batch_size, total_steps=total_steps)
    )
