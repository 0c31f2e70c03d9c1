"""The transport's raw frames are serialised `Chunk`s: same bytes, same decoding, same refusals."""

from __future__ import annotations

import pytest
import torch
from disttrain_trainer.launcher import env as envmod
from disttrain_trainer.tensor_transport import codec, frames
from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb

TENSORS = [("a", torch.arange(10, dtype=torch.float32).reshape(2, 5)), ("b", torch.arange(7, dtype=torch.int64)),
           ("empty", torch.zeros(0)), ("c", torch.ones(3, dtype=torch.float16))]  # fmt: skip


def header() -> pb.StreamHeader:
    return codec.make_header(kind="grad", round=3, tensors=TENSORS, scalars={"loss": 0.5}, attrs={"worker": "w"})


@pytest.mark.parametrize("chunk", [1, 7, 16, 1 << 20])
def test_frames_are_the_serialised_chunks_of_the_codec(chunk: int) -> None:
    got = list(frames.encode(header(), TENSORS, chunk))
    assert got == [c.SerializeToString() for c in codec.encode(header(), TENSORS, chunk)]
    back = frames.decode_all(got, 1 << 20)
    assert back.header == header()
    for (n1, t1), (n2, t2) in zip(back.tensors, TENSORS, strict=True):
        assert n1 == n2 and t1.dtype == t2.dtype and torch.equal(t1, t2)
    # A protobuf peer reads the frames, and the frame decoder reads a protobuf peer's chunks.
    assert codec.decode_all([pb.Chunk.FromString(f) for f in got], 1 << 20).header == header()


def test_decoding_into_given_tensors_writes_in_place_and_checks_first() -> None:
    dest = {n: torch.full_like(t, 9) for n, t in TENSORS}
    keep = {n: t.data_ptr() for n, t in dest.items()}
    frames.decode_all(frames.encode(header(), TENSORS, 5), 1 << 20, into=dest)
    for n, t in TENSORS:
        assert torch.equal(dest[n], t) and dest[n].data_ptr() == keep[n]
    wrong = {**dest, "a": torch.full((5, 2), 9.0)}
    with pytest.raises(codec.StreamError) as e:
        frames.decode_all(frames.encode(header(), TENSORS), 1 << 20, into=wrong)
    assert e.value.reason == "bad_shape" and torch.equal(wrong["a"], torch.full((5, 2), 9.0))
    with pytest.raises(codec.StreamError) as e:
        frames.decode_all(frames.encode(header(), TENSORS), 1 << 20, into={"a": dest["a"]})
    assert e.value.reason == "unknown_tensor"


@pytest.mark.parametrize(("frames_of", "reason"), [
    (lambda fs: fs[:-1], "truncated"),
    (lambda fs: [*fs, b"\x12\x01x"], "too_large"),
    (lambda fs: fs[1:], "no_header"),
    (lambda fs: [fs[0], fs[0]], "bad_stream"),
    (lambda fs: [fs[0][:-1]], "bad_frame"),
    (lambda fs: [b"\x1a\x00"], "bad_frame"),
])  # fmt: skip
def test_bad_streams_are_refused_with_a_reason(frames_of, reason: str) -> None:  # noqa: ANN001
    fs = list(frames.encode(header(), TENSORS, 16))
    with pytest.raises(codec.StreamError) as e:
        frames.decode_all(frames_of(fs), 1 << 20)
    assert e.value.reason == reason


def test_a_stream_larger_than_accepted_is_refused_from_its_header() -> None:
    with pytest.raises(codec.StreamError) as e:
        frames.FrameDecoder(10).feed(next(frames.encode(header(), TENSORS)))
    assert e.value.reason == "too_large"


def test_local_paramserver_processes_get_roles_shards_and_addresses() -> None:
    slots = envmod.gang_slots(2, 1)
    envs = [(s, {"RANK": str(s.rank), "DISTTRAIN_METRICS_PORT": "0"}) for s in slots]
    out = envmod.paramserver_envs(envs, server_ports=[5001, 5002], metrics_ports=[7001, 7002])
    roles = [(s.rank, e["DISTTRAIN_ROLE"], e.get("NODE_RANK")) for s, e in out]
    assert roles == [(2, "server", "0"), (3, "server", "1"), (0, "worker", None), (1, "worker", None)]
    assert {e["DISTTRAIN_SERVER_ADDR"] for _, e in out} == {"127.0.0.1:5001,127.0.0.1:5002"}
    assert [e["DISTTRAIN_METRICS_PORT"] for _, e in out[:2]] == ["7001", "7002"]
