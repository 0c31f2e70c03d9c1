"""Activation (gradient) checkpointing over a stack of blocks (Chen et al. 2016).

`none` keeps every activation; `sqrt` cuts N blocks into about sqrt(N) segments
and keeps only segment inputs, recomputing the rest in backward; `every:K`
makes a segment of every K blocks. Uses torch.utils.checkpoint (non-reentrant),
so gradients are identical to running without it.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def segment_size(policy: str, num_blocks: int) -> int:
    """Blocks per checkpointed segment; 0 means no checkpointing."""
    if policy == "none" or num_blocks == 0:
        return 0
    if policy == "sqrt":
        segments = max(1, round(math.sqrt(num_blocks)))
        return math.ceil(num_blocks / segments)
    if policy.startswith("every:"):
        k = int(policy.split(":", 1)[1])
        if k < 1:
            raise ValueError(f"training.activationCheckpointing {policy!r}: K must be >= 1")
        return k
    raise ValueError(f"training.activationCheckpointing {policy!r} must be none, sqrt or every:K")


def run_blocks(blocks: nn.Sequential, x: torch.Tensor, policy: str) -> torch.Tensor:
    size = segment_size(policy, len(blocks))
    if size == 0 or not torch.is_grad_enabled():
        return blocks(x)
    mods = list(blocks)
    for start in range(0, len(mods), size):
        segment = nn.Sequential(*mods[start : start + size])
        x = checkpoint(segment, x, use_reentrant=False)
    return x
