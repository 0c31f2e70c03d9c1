"""Checks on a decoded update before it may touch the aggregate."""

from __future__ import annotations

import math

import torch

Named = list[tuple[str, torch.Tensor]]


def problem(update: Named, max_norm: float) -> tuple[str, str] | None:
    """(reason label, message) when the update must be refused, else None."""
    sq = 0.0
    for n, t in update:
        if not torch.isfinite(t).all():
            return "non_finite", f"{n} holds NaN or Inf"
        sq += float(t.double().pow(2).sum())
    norm = math.sqrt(sq)
    if norm > max_norm:
        return "norm", f"L2 norm {norm:.4g} exceeds federated.maxUpdateNorm {max_norm:.4g}"
    return None
