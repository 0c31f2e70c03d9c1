"""Parameter-server shard: push checks, staleness bound, delta pulls, checkpoints, sharding.

Every test talks to a real gRPC server on 127.0.0.1 through the worker's own client.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.modes.paramserver import service
from disttrain_trainer.modes.paramserver import shards as shardmap
from disttrain_trainer.modes.paramserver.entry import start_server
from disttrain_trainer.modes.paramserver.server import Shard, ShardConfig
from disttrain_trainer.telemetry.paramserver_series import ServerMetrics
from disttrain_trainer.tensor_transport import auth
from disttrain_trainer.tensor_transport.channel import OPTIONS
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb

SPEC = parse_spec({"mode": "paramserver", "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0,
                                                        "scaleLR": "none", "decay": "none"}})  # fmt: skip
W_SHAPE, B_SHAPE = (4, 3), (4,)
KEY = auth.new_key()
# worker-7 is not one of the job's workers: its credential is not one the shard derives.
CREDS = auth.Credentials.derive(KEY, ["worker-0", "worker-1", "worker-7"])


def initial() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [("w", torch.randn(W_SHAPE, generator=g)), ("b", torch.randn(B_SHAPE, generator=g))]


def make_shard(tmp_path: Path | None = None, *, max_staleness: int = 2, workers: int = 2, steps: int = 100,
               optimizer=SPEC.optimizer, interval: int = 1000) -> Shard:  # fmt: skip
    cfg = ShardConfig(index=0, workers=workers, steps=steps, max_staleness=max_staleness, optimizer=optimizer,
                      push_batch=256, checkpoint_dir=tmp_path, checkpoint_interval=interval, keep=2)  # fmt: skip
    return Shard(cfg, initial(), ServerMetrics(job="t", shard=0, port=0, log_path=None))


@pytest.fixture
def served() -> Iterator[tuple[Shard, service.ShardClient]]:
    shard = make_shard()
    server, port = start_server(shard, "127.0.0.1:0", key=KEY, log=lambda s: None)
    client = service.ShardClient(f"127.0.0.1:{port}", max_bytes=shard.nbytes, creds=CREDS)
    try:
        yield shard, client
    finally:
        client.close()
        server.stop(grace=None).wait()


def params_of(shard: Shard) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in shard.params.items()}


def grads(scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:
    return [("w", torch.full(W_SHAPE, scale)), ("b", torch.full(B_SHAPE, scale))]


def test_bad_pushes_are_rejected_and_leave_the_parameters_untouched(served) -> None:  # noqa: ANN001
    shard, client = served
    first = client.pull(worker="worker-0", version=-1, incarnation="")
    before = params_of(shard)
    inc = first.incarnation
    nan = grads()
    nan[0][1][1, 2] = float("nan")
    inf = grads()
    inf[1][1][0] = float("inf")
    cases = {
        "bad_shape": [("w", torch.ones(3, 4)), ("b", torch.ones(B_SHAPE))],
        "non_finite": nan,
        "bad_dtype": [("w", torch.ones(W_SHAPE, dtype=torch.float16))],
        "unknown_tensor": [("v", torch.ones(2))],
        "duplicate_tensor": [("b", torch.ones(B_SHAPE)), ("b", torch.ones(B_SHAPE))],
    }
    for reason, tensors in cases.items():
        r = client.push(worker="worker-0", version=first.version, incarnation=inc, grads=tensors)
        assert not r.accepted and r.reason.startswith(reason + ":"), (reason, r.reason)
    r = client.push(worker="worker-0", version=first.version, incarnation=inc, grads=inf)
    assert not r.accepted and r.reason.startswith("non_finite:")
    with pytest.raises(grpc.RpcError) as e:
        client.push(worker="worker-7", version=first.version, incarnation=inc, grads=grads())
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown_identity" in e.value.details()
    # A stream larger than the shard holds is refused from its header, before any allocation.
    r = client.push(worker="worker-0", version=first.version, incarnation=inc,
                    grads=[("w", torch.ones(1000, 1000))])  # fmt: skip
    assert not r.accepted and r.reason.startswith("too_large:")
    after = client.pull(worker="worker-0", version=-1, incarnation="")
    assert after.version == 0 and shard.version == 0
    for name, t in after.tensors:
        assert torch.equal(t, before[name])
    for name, t in params_of(shard).items():
        assert torch.equal(t, before[name])
    assert shard.metrics.rejected_count("non_finite") == 2
    assert shard.metrics.rejected_count("bad_shape") == 1
    assert shard.metrics.accepted_total._value.get() == 0
    # Malformed pushes are not iterations: the worker's count is untouched.
    assert after.scalars["workerSteps"] == 0


def test_a_gradient_beyond_the_staleness_bound_is_rejected(served) -> None:  # noqa: ANN001
    shard, client = served  # maxStaleness 2
    slow = client.pull(worker="worker-1", version=-1, incarnation="")
    fast = client.pull(worker="worker-0", version=-1, incarnation="")
    for _ in range(3):  # the fast worker moves the shard to version 3
        assert client.push(worker="worker-0", version=fast.version, incarnation=fast.incarnation,
                           grads=grads()).accepted  # fmt: skip
        fast = client.pull(worker="worker-0", version=fast.version, incarnation=fast.incarnation)
    assert fast.version == 3
    before = params_of(shard)
    r = client.push(worker="worker-1", version=slow.version, incarnation=slow.incarnation, grads=grads())
    assert not r.accepted and r.reason.startswith("stale:") and "staleness 3 exceeds maxStaleness 2" in r.reason
    assert shard.version == 3
    for name, t in params_of(shard).items():
        assert torch.equal(t, before[name])
    # Staleness 2 (within the bound): applied with lr / 2.
    r = client.push(worker="worker-1", version=1, incarnation=slow.incarnation, grads=grads(1.0))
    assert r.accepted
    lr = SPEC.optimizer.lr
    for name, t in params_of(shard).items():
        torch.testing.assert_close(t, before[name] - lr / 2, rtol=0, atol=1e-7)
    assert shard.stats["staleness:3"] == 1 and shard.stats["staleness:2"] == 1
    assert shard.stats["staleness:0"] == 3 and shard.stats["rejected:stale"] == 1


def test_a_pull_sends_only_what_changed_since_the_workers_version(served) -> None:  # noqa: ANN001
    shard, client = served
    p0 = client.pull(worker="worker-0", version=-1, incarnation="")
    assert [n for n, _ in p0.tensors] == ["w", "b"]
    same = client.pull(worker="worker-0", version=p0.version, incarnation=p0.incarnation)
    assert same.tensors == [] and same.wire_bytes < 200
    # Only "b" has a gradient (e.g. a frozen or unused weight): only "b" changes and travels.
    assert client.push(worker="worker-0", version=p0.version, incarnation=p0.incarnation,
                       grads=[("b", torch.ones(B_SHAPE))]).accepted  # fmt: skip
    delta = client.pull(worker="worker-0", version=p0.version, incarnation=p0.incarnation)
    assert delta.version == 1 and [n for n, _ in delta.tensors] == ["b"]
    torch.testing.assert_close(delta.tensors[0][1], dict(p0.tensors)["b"] - SPEC.optimizer.lr)
    assert delta.wire_bytes < p0.wire_bytes
    # Parameters of another server incarnation (a restarted server) are never patched: all of it comes again.
    other = client.pull(worker="worker-0", version=delta.version, incarnation="another")
    assert [n for n, _ in other.tensors] == ["w", "b"]


def test_a_push_from_another_incarnation_is_rejected(served) -> None:  # noqa: ANN001
    shard, client = served
    r = client.push(worker="worker-0", version=0, incarnation="before-restart", grads=grads())
    assert not r.accepted and r.reason.startswith("incarnation:") and shard.version == 0


def test_checkpoint_holds_parameters_optimizer_and_version(tmp_path: Path) -> None:
    momentum = replace(SPEC.optimizer, name="sgd", momentum=0.9)
    shard = make_shard(tmp_path, optimizer=momentum, interval=2)
    for i in range(5):
        assert shard.push(worker="worker-0", version=shard.version, incarnation=shard.incarnation,
                          tensors=grads(0.5 + i)).accepted  # fmt: skip
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000004"]
    at4 = make_shard(tmp_path, optimizer=momentum)
    assert at4.restore() == 4 and at4.version == 4 and at4.resumed_from == 4
    assert at4.worker_steps["worker-0"] == 4 and at4.incarnation != shard.incarnation
    # Continue both from version 4 with the same gradient: momentum state was restored too.
    ref = make_shard(None, optimizer=momentum)
    for i in range(5):
        ref.push(worker="worker-0", version=ref.version, incarnation=ref.incarnation, tensors=grads(0.5 + i))
    at4.push(worker="worker-0", version=4, incarnation=at4.incarnation, tensors=grads(4.5))
    for name in ref.names:
        torch.testing.assert_close(at4.params[name].detach(), ref.params[name].detach(), rtol=0, atol=0)


def test_a_checkpoint_of_another_layout_is_refused(tmp_path: Path) -> None:
    shard = make_shard(tmp_path)
    shard.save()
    other = Shard(replace(shard.cfg), [("w", torch.zeros(W_SHAPE))],
                  ServerMetrics(job="t", shard=0, port=0, log_path=None))  # fmt: skip
    with pytest.raises(ValueError, match="paramServer.shards changed"):
        other.restore()


def test_sharding_is_by_tensor_balanced_and_deterministic() -> None:
    sizes = {"a": 100, "b": 10, "c": 60, "d": 50, "e": 5}
    plan = shardmap.assign(sizes, 2)
    assert plan == [["a", "b", "e"], ["c", "d"]]  # 115 vs 110: largest first onto the lighter shard
    assert shardmap.assign(sizes, 2) == plan
    assert shardmap.assign(sizes, 1) == [list(sizes)]
    with pytest.raises(ValueError, match="exceeds the model's 5 tensors"):
        shardmap.assign(sizes, 6)


def test_a_stream_without_header_is_refused(served) -> None:  # noqa: ANN001
    shard, client = served
    channel = grpc.insecure_channel(client.address, options=OPTIONS)
    push = channel.stream_unary(service.PUSH, request_serializer=pb.Chunk.SerializeToString,
                                response_deserializer=pb.PushReply.FromString)  # fmt: skip
    md = CREDS.metadata("worker-0", shard.incarnation, "0")
    reply = push(iter([pb.Chunk(data=b"\0" * 16)]), metadata=md)
    channel.close()
    assert not reply.accepted and reply.reason.startswith("no_header:")
    assert shard.metrics.rejected_count("no_header") == 1 and shard.version == 0


def test_the_finite_check_is_exact() -> None:
    from disttrain_trainer.modes.paramserver.server import all_finite

    assert all_finite(torch.ones(10))
    assert all_finite(torch.tensor([3e38, 3e38, -1.0]))  # the sum overflows; every element is finite
    assert not all_finite(torch.tensor([1.0, float("nan")]))
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))


def test_a_pull_in_flight_sees_one_version_while_an_update_lands() -> None:
    from disttrain_trainer.tensor_transport import frames

    shard = make_shard()
    before = params_of(shard)
    header, tensors, gen = shard.snapshot(worker="worker-0", version=-1, incarnation="")
    stream = frames.encode(header, tensors, chunk_bytes=16)
    first = next(stream)  # the pull has started streaming the live parameters
    assert shard.push(worker="worker-0", version=0, incarnation=shard.incarnation, tensors=grads()).accepted
    got = frames.decode_all([first, *stream], shard.nbytes)
    shard.release(gen)
    assert got.header.round == 0
    for name, t in got.tensors:
        assert torch.equal(t, before[name])  # version 0, untouched by the update
    for name, t in params_of(shard).items():
        torch.testing.assert_close(t, before[name] - SPEC.optimizer.lr)
    # No reader left: the next update writes in place again.
    ptr = shard.params["w"].data_ptr()
    shard.push(worker="worker-0", version=1, incarnation=shard.incarnation, tensors=grads())
    assert shard.params["w"].data_ptr() == ptr


def test_a_worker_exports_the_time_series_every_mode_exports(tmp_path) -> None:  # noqa: ANN001
    from disttrain_api import metric_names as names
    from disttrain_trainer.telemetry.paramserver_series import WorkerMetrics, WorkerTally

    m = WorkerMetrics(job="j", rank=0, port=0, log_path=tmp_path / "m.jsonl")
    try:
        m.observe_iteration(0.5)
        m.observe(1, WorkerTally(steps=1, samples=8, step_s=0.5, data_s=0.05, compute_s=0.2, pull_s=0.1,
                                 push_s=0.1, idle_s=0.05))  # fmt: skip
        got = {s.name: s for s in m.registry.collect()}

        def value(name: str, suffix: str = "_total") -> float:
            return next(x.value for x in got[name].samples if x.name == name + suffix)

        assert value(names.STEP_SECONDS, "_sum") == 0.5
        assert value(names.COMPUTE_SECONDS) == 0.2
        assert value(names.DATA_SECONDS) == 0.05
        assert value(names.COMM_EXPOSED_SECONDS) == value(names.COMM_BUSY_SECONDS) == 0.2
        assert value(names.IDLE_SECONDS) == 0.05
    finally:
        m.close()
