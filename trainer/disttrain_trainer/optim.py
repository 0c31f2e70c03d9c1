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

import torch
from disttrain_api.model import OptimizerSpec
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


def build_optimizer(params: object, opt: OptimizerSpec, batch_size: int) -> torch.optim.Optimizer:
    lr = peak_lr(opt, batch_size)
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay)  # type: ignore[arg-type]
    if opt.name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=opt.weight_decay)  # type: ignore[arg-type]
    if opt.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=opt.weight_decay)  # type: ignore[arg-type]
    raise ValueError(f"optimizer.name {opt.name!r} must be sgd, adam or adamw")


def build_scheduler(
    optimizer: torch.optim.Optimizer, opt: OptimizerSpec, batch_size: int, total_steps: int
) -> LambdaLR:
    return LambdaLR(
        optimizer, lambda s: lr_factor(s, opt=opt, batch_size=batch_size, total_steps=total_steps)
    )
