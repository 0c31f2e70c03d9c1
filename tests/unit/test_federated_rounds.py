"""Round state machine against real gRPC on 127.0.0.1: secure aggregation with a client that
drops out mid-round and with one whose input breaks the sum's norm bound, an aggregator restart that resumes from its checkpoint while clients
reconnect, and TLS with the operator's self-signed certificate."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import grpc
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_operator.topology.credentials import self_signed_server_cert
from disttrain_trainer.checkpoints import whole
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess
from disttrain_trainer.modes.federated.aggregator import Aggregator
from disttrain_trainer.modes.federated.client import ClientRunner
from disttrain_trainer.modes.federated.entry import client_states, make_evaluator
from disttrain_trainer.modes.federated.local_training import train_local
from disttrain_trainer.modes.federated.settings import client_ids
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.federated_series import AGGREGATOR, FedMetrics
from disttrain_trainer.tensor_transport import auth
from disttrain_trainer.tensor_transport.channel import Tls, aio_channel
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2_grpc as pbg
from ports import free_port  # tests/ports.py: each xdist worker's own slice


def _spec(**fed: object):  # noqa: ANN202
    return parse_spec({
        "mode": "federated", "model": {"name": "mlp", "hidden": 32, "layers": 1},
        "data": {"name": "digits", "batchSize": 32}, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "federated": {"clients": 5, "clientsPerRound": 5, "minAnsweredClients": 3, "rounds": 2,
                      "roundTimeoutSeconds": 30, "partition": {"kind": "iid"}, **fed},
    })  # fmt: skip


def _setup(spec, tmp_path: Path):  # noqa: ANN001, ANN202
    torch.set_num_threads(1)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=tmp_path / "run", checkpoint_root=tmp_path / "ckpt")
    states = client_states(cfg, ds, client_ids(spec.federated.clients))
    return ds, cfg, [states[0::2], states[1::2]]


def test_secure_round_survives_a_client_that_drops_after_sharing_keys(tmp_path: Path) -> None:
    # The timeout is generous so the first attempt closes with the dropout on a loaded machine.
    spec = _spec(secureAggregation=True, rounds=1, roundTimeoutSeconds=20)
    ds, cfg, groups = _setup(spec, tmp_path)
    evaluate = make_evaluator(cfg, ds)
    before = evaluate(inprocess.build_model(spec, ds).state_dict())
    run = asyncio.run(inprocess.run_job(spec, ds, groups, key=auth.new_key(), evaluate=evaluate,
                                        faults={"client-3": "drop_after_share"}))  # fmt: skip
    h = run.aggregator.history
    assert [(r["round"], r["clients_answered"], r["clients_dropped"], r["unmasked_dropped"]) for r in h] == [(1, 4, 1, 1)]
    # The survivors' FedAvg, computed here without any masking: had the dropped client's pairwise
    # masks stayed in the sum, the aggregate would be noise.
    init = inprocess.build_model(spec, ds).state_dict()
    survivors = [st for g in groups for st in g if st.cid != "client-3"]
    results = [train_local(inprocess.build_model(spec, ds), init, st, spec, round_no=1) for st in survivors]
    total = sum(r.num_samples for r in results)
    for name, _ in results[0].update:
        mean = sum(dict(r.update)[name] * r.num_samples for r in results) / total
        assert torch.allclose(run.aggregator.model[name], init[name] + mean, atol=1e-5), name
    assert h[-1]["test_accuracy"] > before


def test_plain_and_secure_aggregation_give_the_same_model(tmp_path: Path) -> None:
    models = []
    for secure in (False, True):
        spec = _spec(secureAggregation=secure, rounds=1)
        ds, _, groups = _setup(spec, tmp_path)
        run = asyncio.run(inprocess.run_job(spec, ds, groups, key=auth.new_key()))
        models.append(run.aggregator.model)
    for n, t in models[0].items():
        # Fixed point with 20 fraction bits on n x update: ~1e-6 / n per weight.
        assert torch.allclose(t, models[1][n], atol=1e-5), n


def test_a_secure_round_whose_unmasked_sum_exceeds_the_clients_bound_is_refused(tmp_path: Path) -> None:
    """Client-3 sends its update at 50 x maxUpdateNorm, unclipped, inside its masked input: no single
    input can be checked, but the unmasked sum of n_u x update is above sum(n_u) x maxUpdateNorm, so
    the attempt is abandoned (`norm`) and the model untouched. The honest clients clip before masking."""
    spec = _spec(secureAggregation=True, rounds=1, maxUpdateNorm=5.0)
    ds, _, groups = _setup(spec, tmp_path)

    async def first_attempt() -> tuple[Aggregator, FedMetrics, dict[str, torch.Tensor]]:
        key = auth.new_key()
        init = inprocess.build_model(spec, ds).state_dict()
        metrics = FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None)
        agg = Aggregator(fed=spec.federated, model=init, key=key, metrics=metrics, log=lambda s: None)
        server, port = await inprocess.start_server(agg)
        channels = [aio_channel(f"127.0.0.1:{port}", None) for _ in groups]
        runners = [ClientRunner(spec=spec, channel=ch, key=key, clients=g, faults={"client-3": "oversized"},
                                make_model=lambda: inprocess.build_model(spec, ds), patience_s=30.0, log=lambda s: None)
                   for ch, g in zip(channels, groups, strict=True)]  # fmt: skip
        tasks = [asyncio.create_task(r.run()) for r in runners]
        playing = asyncio.create_task(agg.run())
        try:  # one attempt: every retry samples the hostile client again
            while agg.round == 0 and agg.attempts < 2:
                assert not playing.done(), playing
                await asyncio.sleep(0.05)
        finally:
            playing.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(playing, *tasks, return_exceptions=True)
            for ch in channels:
                await ch.close()
            await server.stop(0)
        return agg, metrics, init

    agg, metrics, init = asyncio.run(first_attempt())
    assert agg.round == 0 and not agg.history and metrics.abandoned_count("norm") == 1
    assert all(torch.equal(agg.model[n], t) for n, t in init.items())


def test_secure_clients_clip_their_updates_before_masking(tmp_path: Path) -> None:
    """Every honest update (norm ~0.45 here) is above maxUpdateNorm 0.2: each client clips it before
    masking, the sum passes the aggregator's bound, and the model moves by the clipped updates' mean."""
    spec = _spec(secureAggregation=True, rounds=1, maxUpdateNorm=0.2)
    ds, _, groups = _setup(spec, tmp_path)
    # Bounded: were the updates not clipped, every attempt would be abandoned (norm) and sampled again.
    run = asyncio.run(asyncio.wait_for(inprocess.run_job(spec, ds, groups, key=auth.new_key()), 60))
    assert run.aggregator.round == 1 and run.aggregator.attempts == 1
    init = inprocess.build_model(spec, ds).state_dict()
    results = [train_local(inprocess.build_model(spec, ds), init, st, spec, round_no=1) for g in groups for st in g]
    total = sum(r.num_samples for r in results)
    clipped = []
    for r in results:
        norm = math.sqrt(sum(float(t.double().square().sum()) for _, t in r.update))
        assert norm > 0.2
        clipped.append({n: t.double() * (0.2 / norm) for n, t in r.update})
    for name, _ in results[0].update:
        mean = sum(c[name] * r.num_samples for c, r in zip(clipped, results, strict=True)) / total
        assert torch.allclose(run.aggregator.model[name].double(), init[name].double() + mean, atol=1e-5), name


def test_rounds_report_the_time_categories_of_every_mode(tmp_path: Path) -> None:
    """A round is federated mode's step: its record, the summary and the Prometheus series split
    it like every mode's step (compute + exposed communication + data + idle = the round)."""
    spec = _spec(rounds=2)
    ds, _, groups = _setup(spec, tmp_path)
    metrics = FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None)
    run = asyncio.run(inprocess.run_job(spec, ds, groups, key=auth.new_key(), metrics=metrics))
    for r in run.aggregator.history:
        parts = r["compute_s"] + r["comm_exposed_s"] + r["data_s"] + r["idle_s"]
        assert r["compute_s"] > 0 and r["comm_exposed_s"] > 0 and abs(parts - r["step_s"]) < 1e-9, r
        assert r["comm_busy_s"] == r["comm_exposed_s"]  # nothing overlaps a client's transfers
    summary = run.aggregator.summary()
    keys = ("computeFraction", "commExposedFraction", "dataFraction", "idleFraction")
    assert abs(sum(summary[k] for k in keys) - 1.0) < 1e-9, summary
    assert summary["commFraction"] == summary["commExposedFraction"] > 0
    value = metrics.registry.get_sample_value
    labels = metrics.labels
    assert value("disttrain_step_seconds_count", labels) == 2
    step_sum = value("disttrain_step_seconds_sum", labels)
    series = ("compute", "comm_exposed", "data", "idle")
    total = sum(value(f"disttrain_{n}_seconds_total", labels) for n in series)
    assert step_sum > 0 and abs(total - step_sum) < 1e-6



async def _restart_scenario(spec, ds, groups, ckpt: Path) -> tuple[Aggregator, Aggregator, list, list]:  # noqa: ANN001
    key, port = auth.new_key(), free_port()

    def make() -> Aggregator:
        agg = Aggregator(fed=spec.federated, model=inprocess.build_model(spec, ds).state_dict(), key=key,
                         metrics=FedMetrics(job="t", process="aggregator", port=0, log_path=None),
                         checkpoint_dir=ckpt, log=lambda s: None)  # fmt: skip
        agg.restore()
        return agg

    first = make()
    server, _ = await inprocess.start_server(first, port=port)
    playing = asyncio.create_task(first.run())
    channels = [aio_channel(f"127.0.0.1:{port}", None) for _ in groups]
    runners = [ClientRunner(spec=spec, channel=ch, key=key, clients=g, make_model=lambda: inprocess.build_model(spec, ds),
                            patience_s=60.0, log=lambda s: None) for ch, g in zip(channels, groups, strict=True)]  # fmt: skip
    clients = [asyncio.create_task(r.run()) for r in runners]
    # Wait for round 2's published checkpoint, not the round counter: the counter moves before
    # the evaluation and the save, and an aggregator killed in between rightly resumes after round 1.
    while max((step for step, _ in whole.list_checkpoints(ckpt)), default=0) < 2:
        await asyncio.sleep(0.02)
    # The aggregator dies between rounds: its server goes away mid-conversation.
    playing.cancel()
    await server.stop(0)
    await asyncio.sleep(1.0)  # clients are now retrying with backoff
    second = make()
    server, _ = await inprocess.start_server(second, port=port)
    try:
        await second.run()
        await second.wait_clients_told(10.0)
        results = await asyncio.gather(*clients, return_exceptions=True)
    finally:
        for ch in channels:
            await ch.close()
        await server.stop(0)
    return first, second, results, [r.final_summary for r in runners]


def test_restarted_aggregator_resumes_from_its_checkpoint_and_clients_reconnect(tmp_path: Path) -> None:
    spec = _spec(rounds=4, clientsPerRound=3, minAnsweredClients=2)
    ds, _, groups = _setup(spec, tmp_path)
    first, second, results, summaries = asyncio.run(_restart_scenario(spec, ds, groups, tmp_path / "ckpt"))
    assert second.resumed_from is not None and second.resumed_from >= 2
    assert second.round == 4 and [r["round"] for r in second.history] == [1, 2, 3, 4]
    assert results == [None, None]  # every client finished cleanly after reconnecting
    # Every client process heard the job's summary with "done" (client 0 hands it to the operator).
    assert second.final_summary is not None and summaries == [second.final_summary] * 2
    assert second.final_summary["steps"] == 4 and second.final_summary["resumedFromStep"] == second.resumed_from
    assert len(second.final_summary["accuracyPerRound"]) == 4


def test_tls_channel_with_the_operators_certificate(tmp_path: Path) -> None:
    ca, cert, key = self_signed_server_cert(["aggregator.test"])
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
        (tls_dir / name).write_bytes(data)
    spec = _spec(rounds=1)
    ds, _, groups = _setup(spec, tmp_path)
    tls = Tls(dir=tls_dir)
    run = asyncio.run(inprocess.run_job(spec, ds, groups, key=auth.new_key(), tls=tls,
                                        tls_server_name="aggregator.test"))  # fmt: skip
    assert run.aggregator.round == 1

    async def plaintext_to_tls() -> None:
        agg = Aggregator(fed=spec.federated, model={"w": torch.zeros(2)}, key=auth.new_key(),
                         metrics=FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None), log=lambda s: None)  # fmt: skip
        server, port = await inprocess.start_server(agg, tls)
        try:
            for channel in (aio_channel(f"127.0.0.1:{port}", None),  # no TLS at all
                            aio_channel(f"127.0.0.1:{port}", tls, "someone-else.test")):  # wrong server name
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await pbg.FederatedStub(channel).Join(pb.JoinRequest(), timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                await channel.close()
        finally:
            await server.stop(0)

    asyncio.run(plaintext_to_tls())
