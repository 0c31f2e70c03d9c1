"""Federated building blocks: data split, compression, server strategies, secure-aggregation math."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from disttrain_trainer.modes.federated import compression, partition, secagg
from disttrain_trainer.modes.federated.strategy import (
    ADAM_BETA1,
    ADAM_BETA2,
    ADAM_TAU,
    ServerStep,
    WeightedSum,
)


def test_dirichlet_split_covers_every_row_once_and_skews_labels() -> None:
    labels = np.repeat(np.arange(10), 100)
    parts = partition.dirichlet(labels, clients=10, alpha=0.5, seed=0)
    rows = np.concatenate(parts)
    assert sorted(rows.tolist()) == list(range(1000))
    assert min(len(p) for p in parts) >= partition.MIN_ROWS_PER_CLIENT
    # Non-IID: a client's label histogram is far from uniform (IID gives ~0.1 each).
    top_share = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(top_share) > 0.3
    again = partition.dirichlet(labels, clients=10, alpha=0.5, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    iid = partition.iid(1000, 10, seed=0)
    assert sorted(np.concatenate(iid).tolist()) == list(range(1000)) and {len(p) for p in iid} == {100}


def _update(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("a", torch.randn(64, 32, generator=g)), ("b", torch.randn(32, generator=g) * 0.01)]


def test_int8_error_is_at_most_half_a_step_per_tensor() -> None:
    upd = _update()
    wire, scalars = compression.encode("int8", upd)
    assert all(t.dtype == torch.int8 for _, t in wire)
    back = compression.decode("int8", wire, scalars, [(n, t.shape) for n, t in upd])
    for (n, a), (_, b) in zip(upd, back, strict=True):
        step = float(a.abs().max()) / 127
        assert float((a - b).abs().max()) <= step / 2 + 1e-7, n


def test_topk_error_feedback_loses_nothing_over_rounds() -> None:
    shapes = [(n, t.shape) for n, t in _update()]
    residual: dict[str, torch.Tensor] = {}
    sent = {n: torch.zeros(s) for n, s in shapes}
    total = {n: torch.zeros(s) for n, s in shapes}
    for r in range(5):
        upd = _update(r)
        wire, scalars = compression.encode("topk", upd, topk_ratio=0.05, residual=residual)
        assert sum(t.numel() for n, t in wire if n.endswith(".val")) == sum(
            math.ceil(0.05 * math.prod(s)) for _, s in shapes
        )
        for n, t in compression.decode("topk", wire, scalars, shapes):
            sent[n] += t
        for n, t in upd:
            total[n] += t
    # What was sent plus what is still held back is exactly what the client produced.
    for n, _ in shapes:
        assert torch.allclose(sent[n] + residual[n], total[n], atol=1e-5)


def test_decode_refuses_wrong_shape_dtype_and_index() -> None:
    upd = _update()
    shapes = [(n, t.shape) for n, t in upd]
    wire, s = compression.encode("none", upd)
    with pytest.raises(compression.DecodeError) as e:
        compression.decode("none", [(wire[0][0], wire[0][1][:10]), wire[1]], s, shapes)
    assert e.value.reason == "bad_shape"
    with pytest.raises(compression.DecodeError) as e:
        compression.decode("none", [(wire[0][0], wire[0][1].double()), wire[1]], s, shapes)
    assert e.value.reason == "bad_dtype"
    residual: dict[str, torch.Tensor] = {}
    wire, s = compression.encode("topk", upd, topk_ratio=0.1, residual=residual)
    wire[0] = (wire[0][0], wire[0][1] + 10_000)
    with pytest.raises(compression.DecodeError) as e:
        compression.decode("topk", wire, s, shapes)
    assert e.value.reason == "bad_index"


def test_fedavg_is_the_sample_weighted_mean_and_fedadam_follows_reddi() -> None:
    shapes = [("w", torch.Size([3]))]
    ws = WeightedSum(shapes)
    ws.add([("w", torch.tensor([1.0, 2.0, 3.0]))], 1)
    ws.add([("w", torch.tensor([3.0, 2.0, 1.0]))], 3)
    mean = ws.mean()
    assert torch.allclose(mean["w"], torch.tensor([2.5, 2.0, 1.5]))
    model = {"w": torch.zeros(3)}
    ServerStep("fedavg", 1.0).apply(model, mean)
    assert torch.allclose(model["w"], mean["w"])
    adam, model = ServerStep("fedadam", 0.1), {"w": torch.zeros(3)}
    adam.apply(model, mean)
    m = (1 - ADAM_BETA1) * mean["w"]
    v = (1 - ADAM_BETA2) * mean["w"] ** 2
    assert torch.allclose(model["w"], 0.1 * m / (v.sqrt() + ADAM_TAU))


def test_shamir_threshold() -> None:
    secret = bytes(range(32))
    shares = secagg.split(secret, n=5, t=3)
    assert secagg.combine(shares[:3]) == secret
    assert secagg.combine([shares[4], shares[1], shares[2]]) == secret
    with pytest.raises(ValueError, match="do not interpolate"):
        secagg.combine(shares[:2])


def _clients(n: int, dim: int, seed: int = 0) -> tuple[list[str], dict[str, np.ndarray], dict[str, tuple]]:
    rng = np.random.default_rng(seed)
    ids = [f"client-{i}" for i in range(n)]
    xs = {c: rng.normal(0, 0.1, dim) for c in ids}
    keys = {c: (secagg.KeyPair.generate(), bytes(rng.integers(0, 256, 32, dtype=np.uint8))) for c in ids}
    return ids, xs, keys


def _masked(ids, xs, keys, round_id="1.1"):
    pubs = {c: keys[c][0].public_bytes() for c in ids}
    return {c: secagg.masked_input(secagg.to_ring(xs[c]), me=c, self_seed=keys[c][1], mask_keys=keys[c][0],
                                   peers=pubs, round_id=round_id) for c in ids}  # fmt: skip


def test_masked_sum_equals_plain_sum_within_quantisation() -> None:
    ids, xs, keys = _clients(5, 2000)
    ys = _masked(ids, xs, keys)
    total = np.zeros(2000, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for y in ys.values():
            total += y
    plain = secagg.unmask(total, survivors={c: keys[c][1] for c in ids}, dropped={},
                          mask_public={c: keys[c][0].public_bytes() for c in ids}, round_id="1.1")  # fmt: skip
    expect = sum(xs.values())
    assert np.abs(secagg.from_ring(plain) - expect).max() <= len(ids) * 0.5 / secagg.SCALE + 1e-12


def test_what_the_aggregator_receives_is_uncorrelated_with_the_update() -> None:
    ids, xs, keys = _clients(3, 20_000)
    y = _masked(ids, xs, keys)["client-0"]
    # The masked input, read as signed numbers, against the true update: correlation ~ 0.
    r = np.corrcoef(y.view(np.int64).astype(np.float64), xs["client-0"])[0, 1]
    assert abs(r) < 0.03  # 20000 samples: |r| of independent data is ~N(0, 0.007)
    assert np.corrcoef(secagg.from_ring(secagg.to_ring(xs["client-0"])), xs["client-0"])[0, 1] > 0.999


def test_masks_of_a_client_that_dropped_after_sharing_are_removed() -> None:
    ids, xs, keys = _clients(5, 500)
    ys = _masked(ids, xs, keys)
    survivors = ids[:3]  # client-3 and client-4 shared keys but never sent their input
    total = np.zeros(500, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for c in survivors:
            total += ys[c]
    plain = secagg.unmask(
        total, survivors={c: keys[c][1] for c in survivors},
        dropped={c: keys[c][0].private_bytes() for c in ids[3:]},
        mask_public={c: keys[c][0].public_bytes() for c in ids}, round_id="1.1",
    )  # fmt: skip
    expect = sum(xs[c] for c in survivors)
    assert np.abs(secagg.from_ring(plain) - expect).max() <= 3 * 0.5 / secagg.SCALE + 1e-12


def test_sealed_shares_open_only_for_their_pair() -> None:
    a, b, c = (secagg.KeyPair.generate() for _ in range(3))
    k_ab = secagg.agree(a, b.public_bytes(), b"x")
    assert k_ab == secagg.agree(b, a.public_bytes(), b"x")
    blob = secagg.seal(k_ab, "a", "b", b"share")
    assert secagg.open_sealed(k_ab, "a", "b", blob) == b"share"
    with pytest.raises(Exception):  # noqa: B017 - cryptography's InvalidTag
        secagg.open_sealed(secagg.agree(c, b.public_bytes(), b"x"), "a", "b", blob)
