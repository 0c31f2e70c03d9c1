"""Every kind of bad call or update is refused with a reason and a counter; the global model
stays untouched. A real aggregator on 127.0.0.1, a raw gRPC client sending what a broken or
hostile client would."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess
from disttrain_trainer.modes.federated.aggregator import Aggregator
from disttrain_trainer.modes.federated.bindings import JOIN, round_binding, wait_binding
from disttrain_trainer.modes.federated.entry import partition_sizes
from disttrain_trainer.modes.federated.secure_server import Refused
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.federated_series import FedMetrics
from disttrain_trainer.tensor_transport import auth, codec
from disttrain_trainer.tensor_transport.channel import aio_channel
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2_grpc as pbg

CID = "client-0"
MODEL = {"w": torch.zeros(4, 3), "b": torch.zeros(3)}


def _push_chunks(tensors, *, round_no: int, attempt: int, n: float = 10.0, kind: str = "update"):  # noqa: ANN001, ANN202
    header = codec.make_header(kind=kind, round=round_no, tensors=tensors,
                               scalars={"attempt": attempt, "num_samples": n})  # fmt: skip
    return list(codec.encode(header, tensors))


def _good(scale: float = 0.1) -> list[tuple[str, torch.Tensor]]:
    return [("w", torch.full((4, 3), scale)), ("b", torch.full((3,), scale))]


async def _scenario() -> tuple[Aggregator, dict[str, str]]:
    spec = parse_spec({"mode": "federated", "federated": {
        "clients": 1, "clientsPerRound": 1, "minAnsweredClients": 1, "rounds": 2,
        "roundTimeoutSeconds": 60, "maxUpdateNorm": 5.0}})  # fmt: skip
    key = auth.new_key()
    metrics = FedMetrics(job="t", process="aggregator", port=0, log_path=None)
    agg = Aggregator(fed=spec.federated, model=MODEL, key=key, metrics=metrics, log=lambda s: None)
    server, port = await inprocess.start_server(agg)
    rounds = asyncio.create_task(agg.run())
    replies: dict[str, str] = {}
    channel = aio_channel(f"127.0.0.1:{port}", None)
    stub = pbg.FederatedStub(channel)
    creds = auth.Credentials.derive(key, [CID, "client-9"])
    try:
        for label, metadata in [("no token", ((auth.IDENTITY_KEY, CID),)),
                                ("wrong token", auth.Credentials.derive(auth.new_key(), [CID]).metadata(CID, "", JOIN)),
                                ("unknown client", creds.metadata("client-9", "", JOIN))]:  # fmt: skip
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Join(pb.JoinRequest(client_ids=[CID]), metadata=metadata)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            replies[label] = e.value.details()
        session = (await stub.Join(pb.JoinRequest(client_ids=[CID]), metadata=creds.metadata(CID, "", JOIN))).session
        wait = creds.metadata(CID, session, wait_binding(0))
        task = codec.decode_all([c async for c in stub.GetTask(pb.TaskRequest(client_id=CID), metadata=wait)], 1 << 20)
        r, a = task.header.round, int(task.header.scalars["attempt"])
        md = creds.metadata(CID, session, round_binding(r, a))
        bad = {
            "wrong shape": _push_chunks([("w", torch.zeros(3, 4)), ("b", torch.zeros(3))], round_no=r, attempt=a),
            "wrong dtype": _push_chunks([("w", torch.zeros(4, 3, dtype=torch.int32)), ("b", torch.zeros(3))],
                                        round_no=r, attempt=a),
            "NaN": _push_chunks([("w", torch.full((4, 3), float("nan"))), ("b", torch.zeros(3))], round_no=r, attempt=a),
            "Inf": _push_chunks([("w", torch.full((4, 3), float("inf"))), ("b", torch.zeros(3))], round_no=r, attempt=a),
            "norm": _push_chunks(_good(scale=10.0), round_no=r, attempt=a),
            "too large": _push_chunks([("w", torch.zeros(400, 3)), ("b", torch.zeros(3))], round_no=r, attempt=a),
            "future round": _push_chunks(_good(), round_no=r + 1, attempt=a),
            "negative samples": _push_chunks(_good(), round_no=r, attempt=a, n=-5),
        }  # fmt: skip
        for label, chunks in bad.items():
            reply = await stub.PushUpdate(iter(chunks), metadata=md)
            assert not reply.accepted, label
            replies[label] = reply.reason
            assert torch.equal(agg.model["w"], MODEL["w"]) and agg.round == 0, label
        good = _push_chunks(_good(), round_no=r, attempt=a)
        assert (await stub.PushUpdate(iter(good), metadata=md)).accepted
        while agg.round < 1:
            await asyncio.sleep(0.01)
        after_one = {n: t.clone() for n, t in agg.model.items()}
        replay = await stub.PushUpdate(iter(good), metadata=md)  # round 1 again, during round 2
        assert not replay.accepted
        replies["replay"] = replay.reason
        assert all(torch.equal(after_one[n], agg.model[n]) for n in MODEL)
        wait = creds.metadata(CID, session, wait_binding(r))
        task = codec.decode_all([c async for c in stub.GetTask(pb.TaskRequest(client_id=CID), metadata=wait)], 1 << 20)
        r, a = task.header.round, int(task.header.scalars["attempt"])
        md = creds.metadata(CID, session, round_binding(r, a))
        assert (await stub.PushUpdate(iter(_push_chunks(_good(), round_no=r, attempt=a)), metadata=md)).accepted
        await asyncio.wait_for(rounds, 10)
    finally:
        await channel.close()
        await server.stop(0)
    return agg, replies


def test_each_bad_input_is_refused_with_a_reason_and_counted() -> None:
    agg, replies = asyncio.run(_scenario())
    assert replies["no token"].startswith("no_token") and "no bearer token" in replies["no token"]
    assert replies["wrong token"].startswith("bad_token")
    assert replies["unknown client"].startswith("unknown_identity")
    assert replies["wrong shape"].startswith("bad_shape")
    assert replies["wrong dtype"].startswith("bad_dtype")
    assert replies["NaN"].startswith("non_finite") and replies["Inf"].startswith("non_finite")
    assert replies["norm"].startswith("norm") and "maxUpdateNorm" in replies["norm"]
    assert replies["too large"].startswith("too_large")
    assert replies["future round"].startswith("stale")
    assert replies["replay"].startswith("expired_round")  # its token is bound to round 1
    assert replies["negative samples"].startswith("bad_samples")
    m = agg.metrics
    counts = {r: m.rejected_count(r) for r in ("no_token", "bad_token", "unknown_identity", "bad_shape", "bad_dtype",
                                               "non_finite", "norm", "too_large", "stale", "expired_round",
                                               "bad_samples")}  # fmt: skip
    assert counts == {"no_token": 1, "bad_token": 1, "unknown_identity": 1, "bad_shape": 1, "bad_dtype": 1,
                      "non_finite": 2, "norm": 1, "too_large": 1, "stale": 1, "expired_round": 1,
                      "bad_samples": 1}  # fmt: skip
    # Only the two good updates moved the model: FedAvg of one client, server lr 1.
    assert torch.allclose(agg.model["w"], torch.full((4, 3), 0.2)) and agg.round == 2


@pytest.mark.parametrize("model, data", [
    ("gpt", {"name": "pytext"}),
    ("mlp", {"name": "pytext"}),
    ("gpt", {"path": "/data/corpus", "format": "tokens"}),
])  # fmt: skip
def test_language_model_training_is_refused_before_any_client_starts(model: str, data: dict) -> None:
    """Clients train classifiers: next-token targets would crash every client in its first round."""
    from disttrain_api.validation import validate_spec  # noqa: PLC0415

    spec = parse_spec({"mode": "federated", "model": {"name": model}, "data": data,
                       "federated": {"clients": 2, "clientsPerRound": 2, "rounds": 1}})  # fmt: skip
    errors = [str(e) for e in validate_spec(spec)]
    assert any("spec.mode" in e and "federated trains classifiers" in e for e in errors), errors


HOSTILE_SPEC = parse_spec({"mode": "federated", "data": {"name": "digits"}, "federated": {
    "clients": 3, "clientsPerRound": 3, "minAnsweredClients": 3, "rounds": 1, "localEpochs": 2,
    "roundTimeoutSeconds": 60, "maxUpdateNorm": 5.0, "partition": {"kind": "dirichlet", "alpha": 0.5}}})  # fmt: skip


async def _hostile_round(rows: dict[str, int], hostile_samples: float) -> tuple[Aggregator, list[str]]:
    """Three clients, all sampled; client-0 and client-1 declare their own partitions' rows, client-2
    (hostile) declares `hostile_samples` and pushes an update of the opposite sign, within the norm."""
    key, log = auth.new_key(), []
    agg = Aggregator(fed=HOSTILE_SPEC.federated, model=MODEL, key=key, client_rows=rows, log=log.append,
                     metrics=FedMetrics(job="t", process="aggregator", port=0, log_path=None))  # fmt: skip
    server, port = await inprocess.start_server(agg)
    rounds = asyncio.create_task(agg.run())
    channel = aio_channel(f"127.0.0.1:{port}", None)
    stub = pbg.FederatedStub(channel)
    ids = ["client-0", "client-1", "client-2"]
    creds = auth.Credentials.derive(key, ids)
    try:
        sessions = {c: (await stub.Join(pb.JoinRequest(client_ids=[c]), metadata=creds.metadata(c, "", JOIN))).session
                    for c in ids}  # fmt: skip

        async def play(cid: str) -> None:
            wait = creds.metadata(cid, sessions[cid], wait_binding(0))
            chunks = [c async for c in stub.GetTask(pb.TaskRequest(client_id=cid), metadata=wait)]
            task = codec.decode_all(chunks, 1 << 20)
            r, a = task.header.round, int(task.header.scalars["attempt"])
            hostile = cid == "client-2"
            push = _push_chunks(_good(-0.5 if hostile else 0.1), round_no=r, attempt=a,
                                n=hostile_samples if hostile else float(rows[cid]))  # fmt: skip
            reply = await stub.PushUpdate(iter(push), metadata=creds.metadata(cid, sessions[cid], round_binding(r, a)))
            assert reply.accepted, reply.reason

        await asyncio.gather(*(play(c) for c in ids))
        await asyncio.wait_for(rounds, 30)
    finally:
        await channel.close()
        await server.stop(0)
    return agg, log


def test_a_client_declaring_the_whole_data_set_weighs_only_its_own_partition(tmp_path: Path) -> None:
    """The most a client could declare before (every training row x localEpochs) no longer buys
    it the mean: its weight is its partition's rows (as the aggregator process computes them), like
    an honest client's."""
    ds = load_dataset(HOSTILE_SPEC)
    rows = partition_sizes(config_for(HOSTILE_SPEC, run_dir=tmp_path, checkpoint_root=tmp_path), ds)
    claim = float(ds.num_train * HOSTILE_SPEC.federated.local_epochs)
    agg, log = asyncio.run(_hostile_round(rows, claim))
    total = sum(rows.values())
    want = (0.1 * (rows["client-0"] + rows["client-1"]) - 0.5 * rows["client-2"]) / total
    assert torch.allclose(agg.model["w"], torch.full((4, 3), want)), (agg.model["w"][0, 0], want)
    # Uncapped, the hostile client would have had claim / (claim + the others' rows) of the weight.
    share = rows["client-2"] / total
    assert share < 0.5 < claim / (claim + rows["client-0"] + rows["client-1"]), (share, rows)
    assert any(f"client-2 declared {claim:g} samples, its partition holds {rows['client-2']}" in line for line in log)
    # A masked input cannot be reweighted: one that declares more than its partition is refused.
    with pytest.raises(Refused, match="exceeds the .* rows of client-2's partition"):
        agg._weight("client-2", claim, masked=True)
