"""Choosing the stage plan at start: profile on one rank, measure the link, agree on every rank.

Rank 0 profiles every block on one real micro-batch (whole blocks: with tensor
parallelism every stage is split the same way); rank 0 and its peer in stage 1
then time a round trip of the largest activation to measure the bandwidth between stages;
rank 0 runs the partitioner and broadcasts the plan, so every rank builds its
stages from the same plan. A resumed run takes the plan from its checkpoint
instead: profiling is timing and may choose differently, and the checkpoint's
optimizer state belongs to the stages it was saved from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from .partition import BlockProfile, Plan, make_plan, profile_blocks

PING_REPS = 3


def _link_bytes_per_s(nbytes: int, device: torch.device, peer: int) -> float:
    """Round trip of `nbytes` between ranks 0 and `peer`, fastest of PING_REPS; the other ranks return 0."""
    rank = dist.get_rank()
    if rank not in (0, peer) or nbytes <= 0:
        return 0.0
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(PING_REPS + 1):  # the first round trip sets up the connection
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        best = min(best, time.perf_counter() - t0)
    return 2 * buf.numel() * 4 / best


def choose_plan(
    blocks: Sequence[nn.Module], sample: torch.Tensor, *, method: str, stages: int, saved: Plan | None,
    peer: int = 1,
) -> tuple[Plan, list[BlockProfile] | None]:
    """The plan every rank uses (collective: call on all ranks). Profiles only on rank 0;
    `peer` is the global rank holding stage 1 in rank 0's pipeline (the tensor degree)."""
    if saved is not None:
        return saved, None
    rank = dist.get_rank()
    profiles = profile_blocks(blocks, sample) if rank == 0 else None
    largest = [max(p.out_bytes for p in profiles) if profiles else 0]
    dist.broadcast_object_list(largest, src=0)
    bandwidth = _link_bytes_per_s(int(largest[0]), sample.device, peer)
    box: list[Plan | None] = [None]
    if rank == 0:
        assert profiles is not None
        box[0] = make_plan(method, profiles, stages, bytes_per_s=bandwidth)
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0], profiles
