"""The global-batch sampler: rank slices, determinism, resumption, world-size independence, a
memory that does not grow with the data set, old checkpoints refused; the permutation under it;
shard packing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from disttrain_api.model import parse_spec
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.data import sampler as sampler_module
from disttrain_trainer.data.permutation import Permutation
from disttrain_trainer.process.config import ConfigError

PINNED_1437 = [849, 654, 38, 1101, 1042, 325]  # Permutation(1437, (0, 0)) of 0..5
PINNED_2_31 = [1036390546, 1070625626, 1908739605]  # Permutation(2**31, (5, 2)) of 0..2


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


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1437, 4097, 70_001])
def test_the_permutation_is_a_bijection_per_index_and_as_a_table(n: int) -> None:
    perm = Permutation(n, (3, 1))
    image = perm(np.arange(n))
    assert sorted(image.tolist()) == list(range(n))
    assert np.array_equal(perm.table(), image)
    assert np.array_equal(perm(np.array([n - 1, 0])), image[[n - 1, 0]])  # any index on its own


def test_the_order_is_pinned() -> None:
    """A checkpoint's (epoch, offset) counts in this order (sampler.ORDER): changing the permutation
    needs a new ORDER name, or resumed runs would silently see other batches."""
    assert sampler_module.ORDER == "feistel-v1"
    assert Permutation(1437, (0, 0))(np.arange(6)).tolist() == PINNED_1437
    assert Permutation(1 << 31, (5, 2))(np.arange(3)).tolist() == PINNED_2_31


def test_seeds_and_epochs_give_different_orders_that_scatter_neighbours() -> None:
    a, b, c = (Permutation(10_000, s)(np.arange(10_000)) for s in [(0, 0), (0, 1), (1, 0)])
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    # Neighbouring positions land far apart (a uniform shuffle: mean gap n/3), not in runs.
    assert 2500 < np.abs(np.diff(a)).mean() < 4200
    assert abs(np.corrcoef(np.arange(10_000), a)[0, 1]) < 0.05


def test_batches_across_windows_are_the_epoch_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "WINDOW", 16)  # 100 rows: 7 windows, batches straddle them
    s = GlobalBatchSampler(100, 12, seed=4)
    order = Permutation(100, (4, 0))(np.arange(100))
    got = np.concatenate([s.next_global() for _ in range(8)])
    assert np.array_equal(got, order[:96])
    assert s.next_global().tolist() == Permutation(100, (4, 1))(np.arange(12)).tolist()  # epoch 1


def test_memory_does_not_grow_with_the_data_set() -> None:
    """2^40 rows (a corpus no machine holds a permutation of): a batch costs what it costs on 1000."""
    import tracemalloc

    peaks = []
    for n in (1_000_000, 1 << 40):
        tracemalloc.start()
        s = GlobalBatchSampler(n, 64, seed=0, rank=1, world=2)
        rows = [s.next_indices() for _ in range(50)]
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert all(len(r) == 32 and r.min() >= 0 and r.max() < n for r in rows)
    assert peaks[1] < 4 * sampler_module.WINDOW * 8 * sampler_module.KEEP_WINDOWS, peaks
    assert peaks[1] < 2 * peaks[0] + (1 << 20), peaks


def test_a_checkpoint_of_the_older_sampler_is_refused_with_the_fix() -> None:
    s = GlobalBatchSampler(100, 10, seed=0)
    with pytest.raises(ConfigError, match="older trainer.*cannot continue exactly.*afresh"):
        s.load_state_dict({"epoch": 3, "offset": 40, "seed": 0, "batch_size": 10})  # no "order": numpy's
    s.load_state_dict(GlobalBatchSampler(100, 10, seed=0).state_dict())


def test_batch_must_divide_by_world() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        GlobalBatchSampler(100, 10, seed=0, world=3)


def test_digits_packed_into_shards_and_fixed_split(tmp_path: Path) -> None:
    spec = parse_spec({"data": {"name": "digits", "shards": 3, "seed": 9}})
    ds = load_dataset(spec, tmp_path)
    files = sorted(p.name for p in next(tmp_path.glob("digits-*")).glob("train-x-*.npy"))
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
