"""The pipeline's stage timelines exchanged once per log interval (one tensor all-gather) give
the very figures the per-step all_gather_object exchange gave: the same compute, p2p, bubble and
window of every step on every rank, and the same losses. On a GPU the intervals are CUDA events
(gpu-marked test below; skipped without one)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from disttrain_trainer.models import MLP
from disttrain_trainer.modes.pipeline import timeline
from disttrain_trainer.modes.pipeline.partition import Plan, uniform_bounds
from disttrain_trainer.modes.pipeline.schedules import Pipeline
from disttrain_trainer.modes.pipeline.stage_times import split_idle
from disttrain_trainer.parallel.blocks import split_blocks

STEPS, MICRO = 3, 4


def _steps(schedule: str) -> None:
    torch.manual_seed(0)
    blocks = split_blocks(MLP(16, 32, 3, 5, 0.0, "none"))
    virtual = 2 if schedule == "ZBVZeroBubble" else 1
    n = 2 * virtual
    plan = Plan(method="uniform", bounds=uniform_bounds(len(blocks), n), stage_seconds=(0.0,) * n)
    rank, world = dist.get_rank(), dist.get_world_size()
    pipe = Pipeline(blocks, plan, schedule=schedule, microbatches=MICRO, virtual=virtual, pp_rank=rank, pp_size=2,
                    group=None, device=torch.device("cpu"), loss_fn=F.cross_entropy)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    outs = []
    for _ in range(STEPS):
        out = pipe.step(torch.randn(16, 16, generator=gen), torch.randint(0, 5, (16,), generator=gen))
        outs.append(out)
    # Today's exchange: one all_gather_object per step of (identity, intervals, loss).
    old = []
    for out in outs:
        everyone: list = [None] * world
        loss = None if out.loss is None else float(out.loss)
        dist.all_gather_object(everyone, ((0, 0), out.intervals, loss))
        times = split_idle(out.intervals, [ivs for _, ivs, _ in everyone], pipe.num_stages)
        old.append((times, [ls for _, _, ls in everyone if ls is not None]))
    # The interval's exchange: every step packed, one all-gather.
    cap = timeline.capacity(MICRO, len(pipe.stage_ids))
    rows = [timeline.pack(0, 0, None if o.loss is None else float(o.loss), o.intervals, cap) for o in outs]
    got = timeline.exchange(rows, world_size=world, device=torch.device("cpu"))
    for (times, losses), out, ranks in zip(old, outs, got, strict=True):
        assert [r.intervals for r in ranks][rank] == out.intervals  # the same floats, not rounded
        new = split_idle(out.intervals, [r.intervals for r in ranks], pipe.num_stages)
        assert new == times, (new, times)
        assert [r.loss for r in ranks if r.loss is not None] == losses
        assert times.window_s > 0 and times.compute_s > 0


def _all() -> None:
    for schedule in ("1F1B", "ZBVZeroBubble"):  # one interval kind set each: F/B, and F/B/W on two stages a rank
        _steps(schedule)


def test_interval_exchange_gives_the_per_step_figures(gloo) -> None:  # noqa: ANN001
    gloo(_all, 2)


def test_pack_keeps_every_float_and_refuses_overflow() -> None:
    ivs = [("F", 0, 0, 1.7e9 + 0.123456789, 1.7e9 + 0.2), ("W", 1, 3, 1.7e9 + 0.3, 1.7e9 + 0.45)]
    step = timeline.unpack(timeline.pack(1, 0, 2.5, ivs, 3))
    assert (step.dp_rank, step.tp_rank, step.loss, step.intervals) == (1, 0, 2.5, ivs)
    assert timeline.unpack(timeline.pack(0, 1, None, [], 1)).loss is None
    with pytest.raises(ValueError, match="more than the 1 a rank can have"):
        timeline.pack(0, 0, None, ivs, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_intervals_time_the_kernels_not_their_launch() -> None:
    dev = torch.device("cuda", 0)
    clock = timeline.StageClock(dev)
    a = torch.randn(4096, 4096, device=dev)
    # The first product on a fresh device creates cuBLAS's handle and loads its kernels on the host
    # (measured on an H200: 0.12 s of "launch" for 0.17 s of kernels): done before the timing.
    (a @ a).sum().item()
    clock.start_interval()
    host0 = timeline.time_now()
    t0 = clock.mark()
    for _ in range(20):
        a = a @ a / 64.0
    t1 = clock.mark()
    launched = timeline.time_now() - host0  # the host is back long before the GPU is done
    torch.cuda.synchronize(dev)
    done = timeline.time_now() - host0
    start, end = clock.resolve(t0), clock.resolve(t1)
    assert end - start > 2 * launched, (end - start, launched)
    assert end - start <= done * 1.05 and abs(end - (host0 + done)) < 0.05 + 0.05 * done
