"""The global-batch sampler: rank slices, determinism, resumption, world-size independence; shard packing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from disttrain_api.model import parse_spec
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.process.config import ConfigError


def test_rank_slices_partition_the_global_batch() -> None:
    single = GlobalBatchSampler(100, 12, seed=1)
    ranks = [GlobalBatchSampler(100, 12, seed=1, rank=r, world=3) for r in range(3)]
    for _ in range(20):  # crosses epoch boundaries (8 batches per epoch, remainder dropped)
        g = single.next_global()
        parts = [s.next_indices() for s in ranks]
        assert np.array_equal(np.concatenate(parts), g)
        assert len(set(g.tolist())) == 12


def test_epochs_reshuffle_and_drop_the_partial_batch() -> None:
    s = GlobalBatchSampler(10, 4, seed=0)
    e0 = [s.next_global() for _ in range(2)]
    assert s.epoch == 0
    e1 = s.next_global()
    assert s.epoch == 1 and s.offset == 4
    assert not np.array_equal(np.concatenate(e0)[:4], e1)


def test_resume_from_state_continues_identically_even_at_another_world_size() -> None:
    a = GlobalBatchSampler(50, 8, seed=5, rank=0, world=2)
    for _ in range(9):
        a.next_indices()
    state = a.state_dict()
    later = [a.next_global() for _ in range(10)]
    b = GlobalBatchSampler(50, 8, seed=5, rank=0, world=1)
    b.load_state_dict(state)
    assert all(np.array_equal(x, b.next_global()) for x in later)


def test_batch_must_divide_by_world() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        GlobalBatchSampler(100, 10, seed=0, world=3)


def test_digits_packed_into_shards_and_fixed_split(tmp_path: Path) -> None:
    spec = parse_spec({"data": {"name": "digits", "shards": 3, "seed": 9}})
    ds = load_dataset(spec, tmp_path)
    files = sorted(p.name for p in next(tmp_path.iterdir()).glob("train-x-*.npy"))
    assert files == [f"train-x-{i:05d}-of-00003.npy" for i in range(3)]
    assert ds.num_train == 1437 and len(ds.test_x) == 360 and ds.num_classes == 10
    x, y = ds.batch(np.array([0, 500, 1436]))
    assert x.shape == (3, 64) and y.shape == (3,)
    # The test split does not depend on data.seed (a different seed reuses the same packed files).
    other = load_dataset(parse_spec({"data": {"name": "digits", "shards": 3, "seed": 1}}), tmp_path)
    assert np.array_equal(other.test_y, ds.test_y)


def test_pytext_windows_shift_by_one(tmp_path: Path) -> None:
    spec = parse_spec(
        {"model": {"name": "gpt", "blockSize": 16}, "data": {"name": "pytext", "shards": 2}}
    )
    ds = load_dataset(spec, tmp_path)
    assert ds.kind == "lm" and ds.num_classes > 50
    rows = np.array([0, ds.num_train // 2, ds.num_train - 1])
    x, y = ds.batch(rows)
    assert x.shape == (3, 16) and np.array_equal(x[:, 1:], y[:, :-1])
    vx, vy = ds.test_batches()
    assert vx.shape[1] == 16 and np.array_equal(vx[:, 1:], vy[:, :-1])
