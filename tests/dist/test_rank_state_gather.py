"""The asynchronous gather behind checkpoints: every rank's part arrives, in rank order, while
other collectives are issued after it; an oversized part is refused the same way on every rank;
parts of different sizes gather synchronously; a rank that sends a pickle instead of its part gets
it refused by every peer, unread."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from disttrain_trainer.checkpoints import rank_state as resume
from disttrain_trainer.checkpoints import safe_state


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


class Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (Path(self.target), "code ran"))


def _sizes_differ_and_a_planted_part_is_refused(target: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    got = resume.gather_now({"rank": rank, "feedback": torch.full((rank * 1000 + 1,), float(rank))}, world,
                            torch.device("cpu")).result()  # fmt: skip
    assert [g["feedback"].numel() for g in got] == [r * 1000 + 1 for r in range(world)]
    # Rank 1 sends a pickle where its part goes (a compromised pod): nobody runs it.
    data = pickle.dumps(Payload(target)) if rank == 1 else safe_state.dumps({"rank": rank})
    slots = [torch.empty(resume.GATHER_SLOT_BYTES, dtype=torch.uint8) for _ in range(world)]
    work = dist.all_gather(slots, resume._slot(data, resume.GATHER_SLOT_BYTES), async_op=True)
    with pytest.raises(safe_state.UnsafeCheckpoint, match="rank 1's checkpoint part"):
        resume.PendingGather(slots=slots, work=work).result()
    dist.barrier()
    assert not Path(target).exists()


def test_parts_of_any_size_gather_and_a_planted_one_is_refused(gloo, tmp_path: Path) -> None:  # noqa: ANN001
    gloo(_sizes_differ_and_a_planted_part_is_refused, 3, str(tmp_path / "pwned"))
    assert not (tmp_path / "pwned").exists()
