"""Parameter-server shards admit a worker only with its own credential, refuse replayed pushes,
speak TLS with the operator's certificate and enforce their limits.

Real shard servers on 127.0.0.1; the hostile calls are raw gRPC, as any pod could make them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_operator.topology.credentials import self_signed_server_cert
from disttrain_trainer.modes.paramserver import service
from disttrain_trainer.modes.paramserver.entry import start_server
from disttrain_trainer.modes.paramserver.server import Shard, ShardConfig
from disttrain_trainer.telemetry.paramserver_series import ServerMetrics
from disttrain_trainer.tensor_transport import auth, codec, frames
from disttrain_trainer.tensor_transport.channel import OPTIONS, Tls
from disttrain_trainer.tensor_transport.limits import Limits
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb

SPEC = parse_spec({"mode": "paramserver", "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0,
                                                        "scaleLR": "none", "decay": "none"}})  # fmt: skip


def shard() -> Shard:
    cfg = ShardConfig(index=0, workers=2, steps=100, max_staleness=4, optimizer=SPEC.optimizer, push_batch=64,
                      checkpoint_dir=None, checkpoint_interval=1000, keep=1)  # fmt: skip
    return Shard(cfg, [("w", torch.zeros(4, 3))], ServerMetrics(job="t", shard=0, port=0, log_path=None))


def grad_frames(incarnation: str, version: int = 0, attrs: dict[str, str] | None = None) -> list[bytes]:
    tensors = [("w", torch.ones(4, 3))]
    header = codec.make_header(kind=service.KIND_GRAD, round=version, tensors=tensors,
                               attrs={service.ATTR_INCARNATION: incarnation, **(attrs or {})})  # fmt: skip
    return list(frames.encode(header, tensors))


def refusal(e: grpc.RpcError) -> str:
    return next((v for k, v in e.trailing_metadata() or () if k == auth.REFUSAL_KEY), "")


class Raw:
    """What any pod can send: raw calls with whatever metadata it can make."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address, options=OPTIONS)
        self.push = self.channel.stream_unary(service.PUSH, response_deserializer=pb.PushReply.FromString)
        self.pull = self.channel.unary_stream(service.PULL, request_serializer=pb.Chunk.SerializeToString)


@pytest.fixture
def served() -> Iterator[tuple[Shard, str, bytes]]:
    key, s = auth.new_key(), shard()
    server, port = start_server(s, "127.0.0.1:0", key=key, log=lambda m: None)
    try:
        yield s, f"127.0.0.1:{port}", key
    finally:
        server.stop(grace=None).wait()


def test_a_worker_cannot_push_or_pull_as_another(served) -> None:  # noqa: ANN001
    s, address, key = served
    raw = Raw(address)
    cred0 = auth.credential(key, "worker-0")
    # worker-0's credential signing a push that claims to be worker-1
    md = ((auth.IDENTITY_KEY, "worker-1"), (auth.SESSION_KEY, s.incarnation), (auth.BINDING_KEY, "0"),
          (auth.TOKEN_KEY, auth.SCHEME + auth.token(cred0, "worker-1", s.incarnation, "0")))  # fmt: skip
    with pytest.raises(grpc.RpcError) as e:
        raw.push(iter(grad_frames(s.incarnation)), metadata=md)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and refusal(e.value) == auth.WRONG_IDENTITY
    with pytest.raises(grpc.RpcError) as e:
        list(raw.pull(pb.Chunk(header=codec.make_header(kind=service.KIND_PULL, round=-1, tensors=())), metadata=md))
    assert refusal(e.value) == auth.WRONG_IDENTITY
    # No token at all (what any pod of the cluster could send before).
    with pytest.raises(grpc.RpcError) as e:
        raw.push(iter(grad_frames(s.incarnation, attrs={"worker": "worker-1"})))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and refusal(e.value) == auth.NO_TOKEN
    # worker-0's own token with a header naming worker-1: the push counts for the worker the token proves.
    own = auth.Credentials.derive(key, ["worker-0"]).metadata("worker-0", s.incarnation, "0")
    assert raw.push(iter(grad_frames(s.incarnation, attrs={"worker": "worker-1"})), metadata=own).accepted
    assert s.worker_steps == {"worker-0": 1, "worker-1": 0} and s.version == 1
    assert s.metrics.rejected_count(auth.WRONG_IDENTITY) == 2 and s.metrics.rejected_count(auth.NO_TOKEN) == 1
    raw.channel.close()


def test_a_replayed_push_is_refused_and_counted(served) -> None:  # noqa: ANN001
    s, address, key = served
    raw = Raw(address)
    md = auth.Credentials.derive(key, ["worker-0"]).metadata("worker-0", s.incarnation, "0")
    assert raw.push(iter(grad_frames(s.incarnation)), metadata=md).accepted
    before = s.params["w"].detach().clone()
    for _ in range(2):
        reply = raw.push(iter(grad_frames(s.incarnation, version=1)), metadata=md)
        assert not reply.accepted and reply.reason.startswith(auth.EXPIRED_ROUND) and reply.sequence == 1
    assert s.version == 1 and s.worker_steps["worker-0"] == 1 and torch.equal(s.params["w"], before)
    assert s.metrics.rejected_count(auth.EXPIRED_ROUND) == 2
    raw.channel.close()


def test_a_restarted_shard_refuses_the_last_ones_tokens_and_its_workers_say_hello_again() -> None:
    key = auth.new_key()
    first = shard()
    server, port = start_server(first, "127.0.0.1:0", key=key, log=lambda m: None)
    client = service.ShardClient(f"127.0.0.1:{port}", max_bytes=first.nbytes, creds=auth.Credentials.derive(key, ["worker-0"]))
    got = client.pull(worker="worker-0", version=-1, incarnation="")
    old = client.creds.metadata("worker-0", client.session, "0")
    server.stop(grace=None).wait()
    second = shard()
    server, _ = start_server(second, f"127.0.0.1:{port}", key=key, log=lambda m: None)
    try:
        reply = Raw(f"127.0.0.1:{port}").push(iter(grad_frames(got.incarnation)), metadata=old)
        assert not reply.accepted and reply.reason.startswith(auth.EXPIRED_SESSION)
        assert second.metrics.rejected_count(auth.EXPIRED_SESSION) == 1 and second.version == 0
        # The worker's own client learns the new incarnation and goes on.
        again = client.pull(worker="worker-0", version=got.version, incarnation=got.incarnation)
        assert again.incarnation == second.incarnation and client.session == second.incarnation
        assert client.push(worker="worker-0", version=again.version, incarnation=again.incarnation,
                           grads=[("w", torch.ones(4, 3))]).accepted  # fmt: skip
    finally:
        client.close()
        server.stop(grace=None).wait()


def test_limits_refuse_a_worker_over_its_rate_and_a_stream_over_its_bytes() -> None:
    key, s = auth.new_key(), shard()
    tight = Limits(max_stream_bytes=64, max_concurrent_streams=8, max_concurrent_rpcs=8, max_calls_in_flight=2,
                   calls_per_s=0.01, burst=3)  # fmt: skip
    server, port = start_server(s, "127.0.0.1:0", key=key, limits=tight, log=lambda m: None)
    client = service.ShardClient(f"127.0.0.1:{port}", max_bytes=s.nbytes, creds=auth.Credentials.derive(key, ["worker-0"]))
    try:
        first = client.pull(worker="worker-0", version=-1, incarnation="")  # hello + pull: 2 of the burst of 3
        with pytest.raises(grpc.RpcError) as e:  # 48 bytes of gradient + its header > 64
            client.push(worker="worker-0", version=first.version, incarnation=first.incarnation,
                        grads=[("w", torch.ones(4, 3))])  # fmt: skip
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and refusal(e.value) == "stream_too_large"
        with pytest.raises(grpc.RpcError) as e:
            client.pull(worker="worker-0", version=first.version, incarnation=first.incarnation)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and refusal(e.value) == "rate_limited"
        # The channel retries a call refused for its rate 5 times (channel.OPTIONS), never a stream too long.
        assert s.metrics.rejected_count("stream_too_large") == 1 and s.metrics.rejected_count("rate_limited") == 5
        assert s.version == 0
    finally:
        client.close()
        server.stop(grace=None).wait()


def test_workers_reach_a_shard_over_tls_with_the_operators_certificate(tmp_path: Path) -> None:
    ca, cert, pem = self_signed_server_cert(["job-server.ns.svc.cluster.local"])
    for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", pem)):
        (tmp_path / name).write_bytes(data)
    tls = Tls(dir=tmp_path)
    key, s = auth.new_key(), shard()
    server, port = start_server(s, "127.0.0.1:0", key=key, tls=tls, log=lambda m: None)
    creds = auth.Credentials.derive(key, ["worker-0"])
    try:
        client = service.ShardClient(f"127.0.0.1:{port}", max_bytes=s.nbytes, creds=creds, tls=tls,
                                     server_name="job-server.ns.svc.cluster.local")  # fmt: skip
        got = client.pull(worker="worker-0", version=-1, incarnation="")
        assert client.push(worker="worker-0", version=got.version, incarnation=got.incarnation,
                           grads=[("w", torch.ones(4, 3))]).accepted  # fmt: skip
        client.close()
        for plain in (service.ShardClient(f"127.0.0.1:{port}", max_bytes=s.nbytes, creds=creds),
                      service.ShardClient(f"127.0.0.1:{port}", max_bytes=s.nbytes, creds=creds, tls=tls,
                                          server_name="someone-else.test")):  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                plain.pull(worker="worker-0", version=-1, incarnation="", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            plain.close()
        assert s.version == 1
    finally:
        server.stop(grace=None).wait()
