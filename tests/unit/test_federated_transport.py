"""The chunked-tensor codec: raw bytes round-trip in chunks, and oversize streams are refused."""

from __future__ import annotations

import pytest
import torch
from disttrain_trainer.tensor_transport import codec


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("w", torch.randn(300, 700, generator=g)),
        ("q", torch.randint(-127, 127, (1001,), generator=g, dtype=torch.int8)),
        ("i", torch.arange(17, dtype=torch.int64)),
        ("h", torch.randn(5, 3, generator=g).to(torch.bfloat16)),
        ("s", torch.tensor(3.5)),
        ("e", torch.empty(0, 4)),
    ]


def test_round_trip_over_many_chunks_is_bit_exact() -> None:
    ts = _tensors()
    header = codec.make_header(kind="update", round=7, tensors=ts, scalars={"num_samples": 12})
    chunks = list(codec.encode(header, ts, chunk_bytes=4096))
    payload = sum(t.numel() * t.element_size() for _, t in ts)
    assert len(chunks) == -(-payload // 4096)
    assert chunks[0].HasField("header") and not any(c.HasField("header") for c in chunks[1:])
    got = codec.decode_all(chunks, max_bytes=payload)
    assert got.header.round == 7 and got.header.scalars["num_samples"] == 12
    for (n, a), (m, b) in zip(ts, got.tensors, strict=True):
        assert n == m and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_a_model_larger_than_grpcs_4mb_default_travels_in_chunks() -> None:
    big = [("w", torch.ones(3_000_000))]  # 12 MB
    chunks = list(codec.encode(codec.make_header(kind="model", round=1, tensors=big), big))
    assert max(len(c.data) for c in chunks) <= codec.CHUNK_BYTES and len(chunks) == 3
    assert torch.equal(codec.decode_all(chunks, max_bytes=12_000_000).tensors[0][1], big[0][1])


def test_header_declaring_more_than_accepted_is_refused_before_allocation() -> None:
    ts = [("w", torch.ones(1000))]
    chunks = codec.encode(codec.make_header(kind="update", round=1, tensors=ts), ts)
    with pytest.raises(codec.StreamError) as e:
        codec.decode_all(chunks, max_bytes=3999)
    assert e.value.reason == "too_large"


def test_more_bytes_than_the_header_declared_are_refused() -> None:
    ts = [("w", torch.ones(10))]
    chunks = list(codec.encode(codec.make_header(kind="update", round=1, tensors=ts), ts))
    chunks.append(codec.pb.Chunk(data=b"\0" * 8))
    with pytest.raises(codec.StreamError) as e:
        codec.decode_all(chunks, max_bytes=1 << 20)
    assert e.value.reason == "too_large"


def test_truncated_stream_and_unknown_dtype_are_refused() -> None:
    ts = [("w", torch.ones(10))]
    chunks = list(codec.encode(codec.make_header(kind="update", round=1, tensors=ts), ts, chunk_bytes=16))
    with pytest.raises(codec.StreamError, match="ended after"):
        codec.decode_all(chunks[:-1], max_bytes=1 << 20)
    h = codec.pb.StreamHeader(kind="update", round=1)
    h.tensors.add(name="w", dtype="complex128", shape=[2])
    with pytest.raises(codec.StreamError) as e:
        codec.decode_all([codec.pb.Chunk(header=h)], max_bytes=1 << 20)
    assert e.value.reason == "bad_dtype"

