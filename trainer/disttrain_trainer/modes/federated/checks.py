"""Checks on a decoded update before it may touch the aggregate."""

from __future__ import annotations

import math

import torch

Named = list[tuple[str, torch.Tensor]]


def problem(update: Named, max_norm: float) -> tuple[str, str] | None:
    """(reason label, message) when the update must be refused, else None.

    One pass over the bytes: the norm of a tensor holding NaN or Inf is not finite, so
    the elementwise check runs only on that (rare) path, to tell the two reasons apart.
    """
    sq = 0.0
    for n, t in update:
        norm = float(torch.linalg.vector_norm(t if t.dtype == torch.float32 else t.float()))
        if not math.isfinite(norm):
            if not bool(torch.isfinite(t).all()):
                return "non_finite", f"{n} holds NaN or Inf"
            return "norm", f"{n}: L2 norm overflows float32; federated.maxUpdateNorm is {max_norm:.4g}"
        sq += norm * norm
    norm = math.sqrt(sq)
    if norm > max_norm:
        return "norm", f"L2 norm {norm:.4g} exceeds federated.maxUpdateNorm {max_norm:.4g}"
    return None
