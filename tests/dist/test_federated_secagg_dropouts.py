"""Secure aggregation under every dropout pattern (Bonawitz et al. 2017), over real gRPC on 127.0.0.1.

Five clients, all sampled, threshold t = 3. A client stops talking for good (the fault hook
returns from its loop: no further call) after AdvertiseKeys, after ShareKeys, after sending its
masked input, or after receiving the unmask plan without revealing, once with 4 survivors and once
with exactly t. Each round either equals the plain FedAvg of the clients whose masked inputs were
summed (to the ring's precision) or is abandoned with a counted reason and the model untouched.

All scenarios run at once in one event loop (each with its own aggregator and port): each costs
one stage timeout for its dropouts, and they wait in parallel.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess
from disttrain_trainer.modes.federated.aggregator import Aggregator
from disttrain_trainer.modes.federated.client import ClientRunner
from disttrain_trainer.modes.federated.entry import client_states
from disttrain_trainer.modes.federated.local_training import ClientState, train_local
from disttrain_trainer.modes.federated.settings import client_ids
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.federated_series import AGGREGATOR, FedMetrics
from disttrain_trainer.tensor_transport import auth
from disttrain_trainer.tensor_transport.channel import aio_channel

pytestmark = pytest.mark.dist

# Generous: every honest client must make each stage on a loaded 2-core machine; a dropout costs
# one timeout, and the scenarios wait out theirs together.
STAGE_TIMEOUT_S = 12
SPEC = {
    "mode": "federated", "model": {"name": "mlp", "hidden": 32, "layers": 1},
    "data": {"name": "digits", "batchSize": 32}, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    "federated": {"clients": 5, "clientsPerRound": 5, "minAnsweredClients": 3, "rounds": 1,
                  "secureAggregation": True, "roundTimeoutSeconds": STAGE_TIMEOUT_S, "partition": {"kind": "iid"}},
}  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    faults: dict[str, str]
    answered: int  # masked inputs in the sum (U3)
    unmasked_dropped: int  # U2 - U3: clients whose pairwise masks were rebuilt from shares
    abandoned: str | None = None  # the counted reason, when the round cannot be published
    lying_u2: bool = False  # the aggregator names U1 as U2 (the clients must refuse to mask)


SCENARIOS = {
    "after_advertise": Scenario({"client-3": "drop_after_advertise"}, 4, 0),
    "after_advertise_threshold": Scenario({"client-1": "drop_after_advertise", "client-3": "drop_after_advertise"}, 3, 0),
    "after_share": Scenario({"client-3": "drop_after_share"}, 4, 1),
    "after_share_threshold": Scenario({"client-1": "drop_after_share", "client-3": "drop_after_share"}, 3, 2),
    "after_masked_input": Scenario({"client-3": "drop_after_masked_input"}, 5, 0),
    "after_masked_input_threshold": Scenario(
        {"client-1": "drop_after_masked_input", "client-3": "drop_after_masked_input"}, 5, 0),
    "before_reveal": Scenario({"client-3": "drop_before_reveal"}, 5, 0),
    "before_reveal_threshold": Scenario({"client-1": "drop_before_reveal", "client-3": "drop_before_reveal"}, 5, 0),
    # Below the threshold: too few shares of each self-mask seed come back.
    "before_reveal_below_threshold": Scenario(
        {c: "drop_before_reveal" for c in ("client-0", "client-1", "client-3")}, 5, 0, abandoned="too_few_reveals"),
    # A mask bug (one client masks against everyone who advertised, as if U1 were U2) with a
    # dropout after AdvertiseKeys: the sanity check on the unmasked weight refuses the round.
    "mask_bug_is_caught": Scenario(
        {"client-3": "drop_after_advertise", "client-0": "mask_over_key_book"}, 4, 0, abandoned="weight_mismatch"),
    # An aggregator that names a U2 with a client no share came from (one that dropped after
    # advertising): every client refuses to mask against it, nothing is summed.
    "lying_u2_is_refused": Scenario({"client-3": "drop_after_advertise"}, 0, 0, abandoned="too_few_answers",
                                    lying_u2=True),
}  # fmt: skip


class LyingU2(Aggregator):
    """Relays the shares honestly but names everyone who advertised keys as U2."""

    async def ShareKeys(self, request, context):  # noqa: ANN001, ANN201, N802
        reply = await super().ShareKeys(request, context)
        if not reply.aborted:
            assert self.current is not None and self.current.secure is not None
            del reply.sharers[:]
            reply.sharers.extend(sorted(self.current.secure.keys))
        return reply


@dataclass
class Outcome:
    aggregator: Aggregator
    metrics: FedMetrics
    init: dict[str, torch.Tensor]
    client_log: list[str]


async def _play(spec, ds, states: list[ClientState], sc: Scenario) -> Outcome:  # noqa: ANN001
    key, faults, client_log = auth.new_key(), sc.faults, []
    init = inprocess.build_model(spec, ds).state_dict()
    metrics = FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None)
    cls = LyingU2 if sc.lying_u2 else Aggregator
    agg = cls(fed=spec.federated, model=init, key=key, metrics=metrics, log=lambda s: None)
    server, port = await inprocess.start_server(agg)
    groups = [states[0::2], states[1::2]]
    channels = [aio_channel(f"127.0.0.1:{port}", None) for _ in groups]
    runners = [ClientRunner(spec=spec, channel=ch, key=key, clients=g, make_model=lambda: inprocess.build_model(spec, ds),
                            faults=faults, patience_s=30.0, log=client_log.append)
               for ch, g in zip(channels, groups, strict=True)]  # fmt: skip
    clients = [asyncio.create_task(r.run()) for r in runners]
    playing = asyncio.create_task(agg.run())
    try:
        # One attempt: it is either published or abandoned (a retry would sample the dropped again).
        while agg.round == 0 and agg.attempts < 2:
            assert not playing.done(), playing
            await asyncio.sleep(0.05)
    finally:
        playing.cancel()
        for t in clients:
            t.cancel()
        await asyncio.gather(playing, *clients, return_exceptions=True)
        for ch in channels:
            await ch.close()
        await server.stop(0)
    return Outcome(aggregator=agg, metrics=metrics, init=init, client_log=client_log)


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, list[ClientState], dict[str, Outcome]]:
    torch.set_num_threads(1)
    spec = parse_spec(SPEC)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=tmp_path_factory.mktemp("run"), checkpoint_root=tmp_path_factory.mktemp("ckpt"))
    states = client_states(cfg, ds, client_ids(5))

    async def all_at_once() -> dict[str, Outcome]:
        outs = await asyncio.gather(*(_play(spec, ds, states, s) for s in SCENARIOS.values()))
        return dict(zip(SCENARIOS, outs, strict=True))

    return spec, ds, states, asyncio.run(all_at_once())


def _plain_fedavg(spec, ds, states: list[ClientState], init, summed: set[str]) -> dict[str, torch.Tensor]:  # noqa: ANN001
    results = [train_local(inprocess.build_model(spec, ds), init, st, spec, round_no=1) for st in states if st.cid in summed]
    total = sum(r.num_samples for r in results)
    return {name: sum(dict(r.update)[name] * r.num_samples for r in results) / total for name, _ in results[0].update}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_dropout_gives_the_survivors_sum_or_an_abandoned_round(played, name: str) -> None:  # noqa: ANN001
    spec, ds, states, outcomes = played
    sc, out = SCENARIOS[name], outcomes[name]
    agg = out.aggregator
    if sc.abandoned is not None:
        assert agg.round == 0 and not agg.history
        assert out.metrics.abandoned_count(sc.abandoned) == 1
        for n, t in out.init.items():
            assert torch.equal(agg.model[n], t), f"{n}: an abandoned round touched the model"
        if sc.lying_u2:
            refusals = [line for line in out.client_log if "does not match the shares held" in line]
            assert len(refusals) == 4, out.client_log  # every client still talking refused
        return
    assert agg.attempts == 1
    [rec] = agg.history
    assert (rec["clients_answered"], rec["unmasked_dropped"]) == (sc.answered, sc.unmasked_dropped), rec
    # Who was summed: every client whose masked input arrived (a client that dropped after that
    # is still in the sum; its self mask comes off from the survivors' shares).
    summed = {f"client-{i}" for i in range(5)}
    summed -= {c for c, f in sc.faults.items() if f in ("drop_after_advertise", "drop_after_share")}
    mean = _plain_fedavg(spec, ds, states, out.init, summed)
    for n, delta in mean.items():
        # Fixed point: 20 fraction bits on n x update, ~1e-6 / n per weight.
        assert torch.allclose(agg.model[n], out.init[n] + delta, atol=1e-5), f"{name}: {n} is not the survivors' mean"

