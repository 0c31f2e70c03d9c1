"""RNG streams for a resumed rank: its own saved streams, or at a new world size its own seed."""

from __future__ import annotations

import random

import numpy as np
import torch
from disttrain_trainer.checkpoints.rank_state import rng_state, seed_rank, set_rng_state


def _draw() -> tuple[float, float, float]:
    return float(torch.rand(1)), float(np.random.rand()), random.random()


def test_seed_rank_gives_each_rank_its_own_reproducible_streams() -> None:
    draws = {}
    for rank in range(4):
        seed_rank(7, 120, rank)
        draws[rank] = _draw()
    assert len(set(draws.values())) == 4  # no rank reuses another's streams
    seed_rank(7, 120, 2)
    assert _draw() == draws[2]  # same (seed, step, rank): same numbers
    seed_rank(7, 121, 2)
    assert _draw() != draws[2]  # a later resume does not replay the earlier stream


def test_saved_streams_continue_exactly() -> None:
    seed_rank(1, 0, 0)
    saved = rng_state()
    expected = _draw()
    seed_rank(9, 9, 9)
    set_rng_state(saved)
    assert _draw() == expected
