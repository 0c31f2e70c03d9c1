"""Shards.take: the in-memory and the memory-mapped read give the rows of the logical array, in order;
Rows: the split of your own rows trains and holds out every row once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from disttrain_trainer.data import arrays
from disttrain_trainer.data.permutation import Permutation


@pytest.mark.parametrize("in_memory_max", [arrays.IN_MEMORY_MAX_BYTES, 0])
def test_take_returns_the_requested_rows_in_order(tmp_path: Path, monkeypatch, in_memory_max: int) -> None:
    monkeypatch.setattr(arrays, "IN_MEMORY_MAX_BYTES", in_memory_max)
    full = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
    files = []
    for s in range(4):  # 13 + 13 + 13 + 11 rows
        f = tmp_path / f"x-{s}.npy"
        np.save(f, full[s * 13 : (s + 1) * 13])
        files.append(f)
    shards = arrays.Shards(files=tuple(files), rows_per_shard=13, total_rows=50)
    rows = np.random.default_rng(0).permutation(50)[:20]
    for _ in range(2):  # the second read comes from the cached array (or the maps)
        assert np.array_equal(shards.take(rows), full[rows])
        assert np.array_equal(shards.take(rows[::-1]), full[rows[::-1]])


@pytest.mark.parametrize("table_max", [arrays.INDEX_TABLE_MAX, 0], ids=["table", "per-row"])
def test_the_split_of_your_rows_holds_out_and_trains_every_row_once(tmp_path: Path, monkeypatch,
                                                                     table_max: int) -> None:  # noqa: ANN001
    monkeypatch.setattr(arrays, "INDEX_TABLE_MAX", table_max)
    np.save(tmp_path / "x.npy", np.arange(200, dtype=np.float32).reshape(100, 2))
    order = Permutation(100, (0, 1))
    rows = arrays.Rows(path=tmp_path / "x.npy", order=order, offset=10, dtype="float32")
    trained = rows.take(np.arange(90))[:, 0] // 2
    held = order(np.arange(10))
    assert sorted([*trained.astype(int).tolist(), *held.tolist()]) == list(range(100))
