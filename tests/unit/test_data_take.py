"""Shards.take: the in-memory and the memory-mapped read give the rows of the logical array, in order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from disttrain_trainer.data import arrays as data


@pytest.mark.parametrize("in_memory_max", [data.IN_MEMORY_MAX_BYTES, 0])
def test_take_returns_the_requested_rows_in_order(tmp_path: Path, monkeypatch, in_memory_max: int) -> None:
    monkeypatch.setattr(data, "IN_MEMORY_MAX_BYTES", in_memory_max)
    full = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
    files = []
    for s in range(4):  # 13 + 13 + 13 + 11 rows
        f = tmp_path / f"x-{s}.npy"
        np.save(f, full[s * 13 : (s + 1) * 13])
        files.append(f)
    shards = data.Shards(files=tuple(files), rows_per_shard=13, total_rows=50)
    rows = np.random.default_rng(0).permutation(50)[:20]
    for _ in range(2):  # the second read comes from the cached array (or the maps)
        assert np.array_equal(shards.take(rows), full[rows])
        assert np.array_equal(shards.take(rows[::-1]), full[rows[::-1]])
