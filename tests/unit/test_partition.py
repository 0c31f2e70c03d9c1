"""The partitioner: the dynamic programme against brute force, and profile vs uniform on a skewed model."""

from __future__ import annotations

import itertools

import pytest
import torch
from disttrain_trainer.modes.pipeline.partition import (
    BlockProfile,
    Plan,
    make_plan,
    min_max_bounds,
    profile_blocks,
    stage_seconds,
    uniform_bounds,
)
from torch import nn


def brute_force(costs: list[float], stages: int, out_bytes: list[int], bw: float) -> float:
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        bounds = list(itertools.pairwise(edges))
        best = min(best, max(stage_seconds(bounds, costs, out_bytes, bw)))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_min_max_matches_brute_force(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(3, 10, (1,), generator=g))
    stages = int(torch.randint(1, n + 1, (1,), generator=g))
    costs = [float(c) for c in torch.rand(n, generator=g)]
    out_bytes = [int(b) for b in torch.randint(0, 1000, (n,), generator=g)]
    bw = 2000.0
    bounds = min_max_bounds(costs, stages, out_bytes=out_bytes, bytes_per_s=bw)
    assert len(bounds) == stages and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a < b for a, b in bounds) and all(b == a2 for (_, b), (a2, _) in itertools.pairwise(bounds))
    assert max(stage_seconds(bounds, costs, out_bytes, bw)) == pytest.approx(brute_force(costs, stages, out_bytes, bw))


def test_transfer_moves_the_cut_to_a_small_activation() -> None:
    # Equal compute; only block 2's output is small enough to send cheaply.
    costs, out_bytes = [1.0, 1.0, 1.0, 1.0], [10_000, 10_000, 10, 10_000]
    assert min_max_bounds(costs, 2) == ((0, 2), (2, 4))
    assert min_max_bounds(costs, 2, out_bytes=out_bytes, bytes_per_s=5_000.0) == ((0, 3), (3, 4))


def test_uniform_and_params() -> None:
    assert uniform_bounds(7, 3) == ((0, 3), (3, 5), (5, 7))
    profiles = [BlockProfile(seconds=1.0, out_bytes=0, params=p) for p in (100, 10, 10, 10, 70)]
    assert make_plan("params", profiles, 2, bytes_per_s=0).bounds == ((0, 1), (1, 5))
    with pytest.raises(ValueError, match="at least one block"):
        uniform_bounds(2, 3)


def test_plan_json_round_trip_and_description() -> None:
    profiles = [BlockProfile(seconds=s, out_bytes=0, params=1) for s in (0.001, 0.004, 0.001, 0.002)]
    plan = make_plan("profile", profiles, 2, bytes_per_s=0)
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.bounds == ((0, 2), (2, 4)) and plan.imbalance == pytest.approx(5 / 4)
    assert plan.describe() == "partition profile: stage 0: blocks 0-1 (5.00 ms); stage 1: blocks 2-3 (3.00 ms); imbalance 1.25"


class Heavy(nn.Module):
    """`k` identical layers in one block: exactly k times the work of a light block."""

    def __init__(self, width: int, k: int):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(k)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_profile_finds_the_balanced_split_of_a_skewed_model() -> None:
    torch.manual_seed(0)
    work = [1, 4, 1, 1, 1, 1, 1, 1]  # block 1 is 4x heavier
    width = 256
    blocks = [Heavy(width, k) for k in work]
    profiles = profile_blocks(blocks, torch.randn(256, width))
    stages = 2
    true = [float(k) for k in work]  # the real relative cost: identical layers
    optimal = max(stage_seconds(min_max_bounds(true, stages), true, [0] * 8, 0))
    profiled = make_plan("profile", profiles, stages, bytes_per_s=0)
    uniform = make_plan("uniform", profiles, stages, bytes_per_s=0)
    profiled_true = max(stage_seconds(profiled.bounds, true, [0] * 8, 0))
    uniform_true = max(stage_seconds(uniform.bounds, true, [0] * 8, 0))
    assert profiled_true <= 1.10 * optimal, (profiled.describe(), profiles)
    assert uniform_true > 1.10 * optimal
    # The measured heavy block is clearly the heaviest.
    assert max(range(8), key=lambda k: profiles[k].seconds) == 1
    assert all(p.out_bytes == 256 * width * 4 for p in profiles)
