"""Which clients a round samples: from all `clients`, unpredictable from the spec, the same after a
resume; Poisson at rate clientsPerRound / clients with central DP (what the accountant analyses),
exactly clientsPerRound otherwise; a sampled client that is not connected is dropped."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess
from disttrain_trainer.modes.federated.aggregator import Aggregator
from disttrain_trainer.modes.federated.entry import client_states
from disttrain_trainer.modes.federated.sampling import ClientSampler
from disttrain_trainer.modes.federated.settings import client_ids
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.federated_series import AGGREGATOR, FedMetrics
from disttrain_trainer.tensor_transport import auth

MODEL = {"w": torch.zeros(4, 3)}
CLIENTS = client_ids(10)


def _spec(private: bool):  # noqa: ANN202
    fed = {"clients": 10, "clientsPerRound": 3, "minAnsweredClients": 2, "rounds": 50}
    if private:
        fed["privacy"] = {"clipNorm": 1.0, "noiseMultiplier": 1.0}
    return parse_spec({"mode": "federated", "data": {"seed": 7}, "federated": fed})


def _aggregator(spec, key: bytes, ckpt: Path | None = None) -> Aggregator:  # noqa: ANN001
    private = spec.federated.privacy is not None
    agg = Aggregator(fed=spec.federated, model=MODEL, key=key, checkpoint_dir=ckpt, log=lambda s: None,
                     metrics=FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None, private=private))  # fmt: skip
    agg.restore()
    return agg


def _samples(agg: Aggregator, attempts: range) -> list[list[str]]:
    return [agg.sample(a, a) for a in attempts]


@pytest.mark.parametrize("private", [False, True])
def test_two_aggregators_of_one_spec_sample_differently_and_a_resumed_one_samples_the_same(
    tmp_path: Path, private: bool
) -> None:
    spec = _spec(private)
    key = auth.new_key()  # even the same server key: the spec and key do not fix the samples
    first, other = _aggregator(spec, key, tmp_path / "a"), _aggregator(spec, key, tmp_path / "b")
    # All the spec's rounds: with 3 of 10 clients a round, some client goes unsampled in 20 rounds
    # once in about 125 runs (10 x 0.7^20), in 50 once in five million.
    rounds = range(1, spec.federated.rounds + 1)
    mine = _samples(first, rounds)
    assert mine != _samples(other, rounds)
    first._save()  # what the aggregator checkpoints after a round
    resumed = _aggregator(spec, key, tmp_path / "a")
    assert _samples(resumed, rounds) == mine
    # From all clients: nobody has called these aggregators, and every client was sampled.
    assert not first.seen and set(itertools.chain(*mine)) == set(CLIENTS)
    if private:
        assert len({len(s) for s in mine}) > 1  # Poisson: the sample's size varies
    else:
        assert all(len(s) == 3 for s in mine)


def test_poisson_includes_each_client_independently_at_the_rate_and_fixed_draws_exactly_k() -> None:
    sampler = ClientSampler(auth.new_key(), CLIENTS)
    n, q = 3000, 0.3
    draws = [set(sampler.poisson(q, r, 1)) for r in range(n)]
    sd = (q * (1 - q) / n) ** 0.5
    for c in CLIENTS:
        assert abs(sum(c in d for d in draws) / n - q) < 5 * sd, c
    # Independence: two clients together at q^2 (a fixed-size sample would give q (k-1) / (N-1)).
    both = sum({"client-0", "client-1"} <= d for d in draws) / n
    assert abs(both - q * q) < 5 * (q * q * (1 - q * q) / n) ** 0.5
    fixed = [sampler.fixed(3, r, 1) for r in range(n)]
    assert all(len(s) == 3 and s == sorted(s) for s in fixed)
    for c in CLIENTS:
        assert abs(sum(c in s for s in fixed) / n - 0.3) < 5 * sd, c
    # Another attempt of the same round draws again.
    assert [sampler.fixed(3, 1, a) for a in range(1, 30)] != [sampler.fixed(3, 1, 1)] * 29


def test_a_sampled_client_that_is_not_connected_is_dropped_and_the_round_goes_on(tmp_path: Path) -> None:
    """3 clients, all sampled; client-2 never connects: the round waits out its timeout for it,
    counts it as sampled and dropped, and publishes the other two's mean."""
    spec = parse_spec({
        "mode": "federated", "model": {"name": "mlp", "hidden": 16, "layers": 1},
        "data": {"name": "digits", "batchSize": 64}, "optimizer": {"name": "sgd", "lr": 0.05},
        "federated": {"clients": 3, "clientsPerRound": 3, "minAnsweredClients": 2, "rounds": 1,
                      "roundTimeoutSeconds": 1, "partition": {"kind": "iid"}},
    })  # fmt: skip
    torch.set_num_threads(1)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=tmp_path / "run", checkpoint_root=tmp_path / "ckpt")
    states = client_states(cfg, ds, client_ids(3))
    started = time.monotonic()
    run = asyncio.run(asyncio.wait_for(inprocess.run_job(spec, ds, [states[:1], states[1:2]], key=auth.new_key()), 30))
    h = run.aggregator.history
    assert [(r["clients_sampled"], r["clients_answered"], r["clients_dropped"]) for r in h] == [(3, 2, 1)]
    assert "client-2" not in run.aggregator.seen
    assert time.monotonic() - started < 20
