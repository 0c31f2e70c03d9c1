"""A client's identity cannot be borrowed, nor its tokens replayed, nor the aggregator flooded.

A real aggregator on 127.0.0.1 and a raw gRPC client playing what a compromised client pod
could do with what it holds: its own clients' credentials (never the server key) and every
token it ever saw on its own connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.modes.federated import inprocess, serving
from disttrain_trainer.modes.federated.aggregator import Aggregator
from disttrain_trainer.modes.federated.bindings import JOIN, round_binding, wait_binding
from disttrain_trainer.telemetry.federated_series import FedMetrics
from disttrain_trainer.tensor_transport import auth, codec
from disttrain_trainer.tensor_transport.channel import add_port, aio_channel
from disttrain_trainer.tensor_transport.limits import Limits
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2_grpc as pbg

MODEL = {"w": torch.zeros(4, 3), "b": torch.zeros(3)}
SPEC = parse_spec({"mode": "federated", "federated": {
    "clients": 2, "clientsPerRound": 2, "minAnsweredClients": 2, "rounds": 3, "roundTimeoutSeconds": 60}})  # fmt: skip


def refusal(e: grpc.aio.AioRpcError) -> str:
    return next((v for k, v in e.trailing_metadata() or () if k == auth.REFUSAL_KEY), "")


def update(round_no: int, attempt: int) -> list[pb.Chunk]:
    tensors = [("w", torch.full((4, 3), 0.1)), ("b", torch.full((3,), 0.1))]
    header = codec.make_header(kind="update", round=round_no, tensors=tensors,
                               scalars={"attempt": attempt, "num_samples": 10.0})  # fmt: skip
    return list(codec.encode(header, tensors))


def aggregator(key: bytes, ckpt: Path | None = None) -> Aggregator:
    agg = Aggregator(fed=SPEC.federated, model=MODEL, key=key, checkpoint_dir=ckpt, log=lambda s: None,
                     metrics=FedMetrics(job="t", process="aggregator", port=0, log_path=None))  # fmt: skip
    agg.restore()
    return agg


class Pod:
    """A client pod: its own credentials, a session, and the tokens it has sent."""

    def __init__(self, stub: pbg.FederatedStub, creds: auth.Credentials):
        self.stub, self.creds, self.session = stub, creds, ""

    async def join(self, cid: str) -> pb.JoinReply:
        reply = await self.stub.Join(pb.JoinRequest(client_ids=[cid]), metadata=self.creds.metadata(cid, "", JOIN))
        self.session = reply.session
        return reply

    async def task(self, cid: str, heard: int) -> codec.Received:
        md = self.creds.metadata(cid, self.session, wait_binding(heard))
        return codec.decode_all([c async for c in self.stub.GetTask(pb.TaskRequest(client_id=cid), metadata=md)],
                                1 << 20)  # fmt: skip


async def play(tmp_path: Path) -> tuple[Aggregator, Aggregator, dict[str, str]]:
    key = auth.new_key()
    first = aggregator(key, tmp_path)
    server, port = await inprocess.start_server(first)
    rounds = asyncio.create_task(first.run())
    channel = aio_channel(f"127.0.0.1:{port}", None)
    stub = pbg.FederatedStub(channel)
    # Two pods, one client each; pod 0 is the compromised one.
    pod0, pod1 = Pod(stub, auth.Credentials.derive(key, ["client-0"])), Pod(stub, auth.Credentials.derive(key, ["client-1"]))
    seen: dict[str, str] = {}
    try:
        await pod0.join("client-0")
        await pod1.join("client-1")
        # Pod 0 speaks for client-1 with what it holds: its own token relabelled, or a token it signs itself.
        own = dict(pod0.creds.metadata("client-0", pod0.session, wait_binding(0)))
        relabelled = tuple({**own, auth.IDENTITY_KEY: "client-1"}.items())
        signed = ((auth.IDENTITY_KEY, "client-1"), (auth.SESSION_KEY, pod0.session),
                  (auth.BINDING_KEY, wait_binding(0)),
                  (auth.TOKEN_KEY, auth.SCHEME + auth.token(auth.credential(key, "client-0"), "client-1", pod0.session,
                                                            wait_binding(0))))  # fmt: skip
        for label, md in (("relabelled", relabelled), ("signed", signed)):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Join(pb.JoinRequest(client_ids=["client-1"]), metadata=md)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            seen[label] = refusal(e.value)
        # Round 1, honestly.
        t0, t1 = await asyncio.gather(pod0.task("client-0", 0), pod1.task("client-1", 0))
        r, a = t0.header.round, int(t0.header.scalars["attempt"])
        round1 = pod0.creds.metadata("client-0", pod0.session, round_binding(r, a))
        for pod, cid in ((pod0, "client-0"), (pod1, "client-1")):
            md = pod.creds.metadata(cid, pod.session, round_binding(r, a))
            assert (await stub.PushUpdate(iter(update(r, a)), metadata=md)).accepted
        while first.round < 1:
            await asyncio.sleep(0.01)
        # Round 2 is open: both clients are sampled again.
        t0, _ = await asyncio.gather(pod0.task("client-0", 1), pod1.task("client-1", 1))
        r2, a2 = t0.header.round, int(t0.header.scalars["attempt"])
        after_one = {n: t.clone() for n, t in first.model.items()}
        # Replays of round 1's token: with round 1's header, and with round 2's.
        for label, chunks in (("replay round 1", update(r, a)), ("replay into round 2", update(r2, a2))):
            reply = await stub.PushUpdate(iter(chunks), metadata=round1)
            assert not reply.accepted
            seen[label] = reply.reason.split(":", 1)[0]
        # A GetTask token made before round 1 completed.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pod0.task("client-0", 0)
        seen["old wait"] = refusal(e.value)
        assert all(torch.equal(after_one[n], first.model[n]) for n in MODEL) and first.round == 1
        round2 = pod0.creds.metadata("client-0", pod0.session, round_binding(r2, a2))
        old_session = pod0.session
    finally:
        rounds.cancel()
        await server.stop(0)
    # Another aggregator process resumes from round 1's checkpoint: round 2 comes again, with a new session.
    second = aggregator(key, tmp_path)
    server, port = await inprocess.start_server(second, port=port)
    rounds = asyncio.create_task(second.run())
    try:
        await pod0.join("client-0")
        await pod1.join("client-1")
        assert pod0.session != old_session and second.round == 1
        t0, _ = await asyncio.gather(pod0.task("client-0", 1), pod1.task("client-1", 1))
        assert t0.header.round == r2  # the same round number as before the restart
        reply = await stub.PushUpdate(iter(update(t0.header.round, int(t0.header.scalars["attempt"]))), metadata=round2)
        assert not reply.accepted
        seen["replay from the last process"] = reply.reason.split(":", 1)[0]
        assert second.round == 1 and all(torch.equal(after_one[n], second.model[n]) for n in MODEL)
    finally:
        rounds.cancel()
        await channel.close()
        await server.stop(0)
    return first, second, seen


def test_a_client_cannot_speak_for_another_nor_replay_a_token(tmp_path: Path) -> None:
    first, second, seen = asyncio.run(play(tmp_path))
    assert seen == {
        "relabelled": auth.WRONG_IDENTITY, "signed": auth.WRONG_IDENTITY,
        "replay round 1": auth.EXPIRED_ROUND, "replay into round 2": auth.EXPIRED_ROUND,
        "old wait": auth.EXPIRED_ROUND, "replay from the last process": auth.EXPIRED_SESSION,
    }  # fmt: skip
    m = first.metrics
    assert m.rejected_count(auth.WRONG_IDENTITY) == 2 and m.rejected_count(auth.EXPIRED_ROUND) == 3
    assert second.metrics.rejected_count(auth.EXPIRED_SESSION) == 1


async def over_limits() -> tuple[Aggregator, list[str], str]:
    key = auth.new_key()
    agg = aggregator(key)
    tight = Limits(max_stream_bytes=100, max_concurrent_streams=8, max_concurrent_rpcs=16, max_calls_in_flight=4,
                   calls_per_s=0.01, burst=4)  # fmt: skip
    server, port = await inprocess.start_server(agg, limits=tight)
    rounds = asyncio.create_task(agg.run())
    channel = aio_channel(f"127.0.0.1:{port}", None)
    stub = pbg.FederatedStub(channel)
    pods = [Pod(stub, auth.Credentials.derive(key, [cid])) for cid in ("client-0", "client-1")]
    codes = []
    try:
        for pod, cid in zip(pods, ("client-0", "client-1"), strict=True):
            await pod.join(cid)
        t0, _ = await asyncio.gather(pods[0].task("client-0", 0), pods[1].task("client-1", 0))
        r, a = t0.header.round, int(t0.header.scalars["attempt"])
        # client-0 has made 2 calls of its burst of 4; its update (> 100 bytes) is cut off.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.PushUpdate(iter(update(r, a)), metadata=pods[0].creds.metadata("client-0", pods[0].session,
                                                                                      round_binding(r, a)))  # fmt: skip
        stream = f"{e.value.code().name} {refusal(e.value)}"
        for _ in range(3):  # the 4th call uses the burst up; at 0.01 calls/s the next ones are refused
            try:
                await pods[0].join("client-0")
                codes.append("OK")
            except grpc.aio.AioRpcError as e:
                codes.append(f"{e.code().name} {refusal(e)}")
        await pods[1].join("client-1")  # another client's allowance is its own
    finally:
        rounds.cancel()
        await channel.close()
        await server.stop(0)
    return agg, codes, stream


def test_a_client_over_its_rate_and_a_stream_over_its_bytes_are_refused_and_counted() -> None:
    agg, codes, stream = asyncio.run(over_limits())
    assert stream == "RESOURCE_EXHAUSTED stream_too_large"
    assert codes == ["OK", "RESOURCE_EXHAUSTED rate_limited", "RESOURCE_EXHAUSTED rate_limited"]
    # The channel retries a call refused for its rate 5 times (channel.OPTIONS), never a stream too long.
    assert agg.metrics.rejected_count("stream_too_large") == 1 and agg.metrics.rejected_count("rate_limited") == 2 * 5
    assert torch.equal(agg.model["w"], MODEL["w"]) and agg.round == 0


async def too_many_at_once() -> tuple[Aggregator, str]:
    key = auth.new_key()
    agg = aggregator(key)  # not running: a GetTask waits for a round that never opens
    two = Limits(max_stream_bytes=1 << 20, max_concurrent_streams=8, max_concurrent_rpcs=16, max_calls_in_flight=2,
                 calls_per_s=1000.0, burst=1000)  # fmt: skip
    g = serving.build_gate(agg, two)
    server = serving.build_server(agg, g=g)
    port = add_port(server, "127.0.0.1:0", None)
    await server.start()
    channel = aio_channel(f"127.0.0.1:{port}", None)
    pod = Pod(pbg.FederatedStub(channel), auth.Credentials.derive(key, ["client-0"]))
    try:
        await pod.join("client-0")
        waiting = [asyncio.create_task(pod.task("client-0", 0)) for _ in range(2)]
        while g.admission.in_flight("client-0") < 2:  # both long polls are past the gate
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await asyncio.wait_for(pod.task("client-0", 0), 30)
        for t in waiting:
            t.cancel()
        return agg, f"{e.value.code().name} {refusal(e.value)}"
    finally:
        await channel.close()
        await server.stop(0)


def test_a_client_with_too_many_calls_in_flight_is_refused() -> None:
    agg, third = asyncio.run(too_many_at_once())
    assert third == "RESOURCE_EXHAUSTED too_many_calls"
    assert agg.metrics.rejected_count("too_many_calls") == 5  # each of the channel's 5 tries
