"""The asynchronous gather behind checkpoints: every rank's part arrives, in rank order, while
other collectives are issued after it; an oversized part is refused the same way on every rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from disttrain_trainer.checkpoints import rank_state as resume


def _gather_behind_other_collectives() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    pending = resume.gather_async({"rank": rank, "rng": resume.rng_state()}, world, torch.device("cpu"))
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)  # issued after the gather, as the next training step's all-reduce is
    dist.barrier()
    got = pending.result()
    assert [g["rank"] for g in got] == list(range(world))
    assert torch.equal(got[rank]["rng"]["torch"], torch.get_rng_state())
    assert torch.equal(t, torch.full((4,), float(sum(range(world)))))
    assert pending.result() is got  # decoded once


def _oversized_part() -> None:
    with pytest.raises(ValueError, match="gather slot"):
        resume.gather_async(b"x" * resume.GATHER_SLOT_BYTES, dist.get_world_size(), torch.device("cpu"))
    dist.barrier()  # no collective was started: the group is still usable


def test_every_rank_gets_every_part_in_rank_order(gloo) -> None:  # noqa: ANN001
    gloo(_gather_behind_other_collectives, 3)


def test_an_oversized_part_is_refused_before_any_collective(gloo) -> None:  # noqa: ANN001
    gloo(_oversized_part, 2)
