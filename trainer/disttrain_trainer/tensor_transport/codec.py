"""Tensors <-> a stream of `Chunk` messages: raw bytes, a header on the first chunk.

Encoding copies each tensor's bytes once into chunk-sized `bytes` (protobuf
needs owned bytes); decoding copies each chunk once into one preallocated
buffer and views the tensors out of it. A receiver states the most bytes it
will take before anything is allocated, so a stream larger than the model is
refused from its header, or at the first chunk past what the header declared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .protos import tensor_transport_pb2 as pb

# 4 MiB of payload per message; channels allow more (see channel.MAX_MESSAGE_BYTES).
CHUNK_BYTES = 4 << 20

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class StreamError(ValueError):
    """A stream that does not decode: the message says what was wrong (logged, counted, refused)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # a short label for the rejection counter


def dtype_name(t: torch.Tensor) -> str:
    try:
        return DTYPE_NAMES[t.dtype]
    except KeyError:
        raise ValueError(f"dtype {t.dtype} cannot travel; use one of {', '.join(DTYPES)}") from None


def nbytes_of(spec: pb.TensorSpec) -> int:
    n = DTYPES[spec.dtype].itemsize
    for d in spec.shape:
        n *= d
    return n


def _raw(t: torch.Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def make_header(
    *,
    kind: str,
    round: int,
    tensors: Sequence[tuple[str, torch.Tensor]],
    scalars: Mapping[str, float] | None = None,
    attrs: Mapping[str, str] | None = None,
) -> pb.StreamHeader:
    h = pb.StreamHeader(kind=kind, round=round)
    for name, t in tensors:
        h.tensors.add(name=name, dtype=dtype_name(t), shape=list(t.shape))
    for k, v in (scalars or {}).items():
        h.scalars[k] = float(v)
    for k, v in (attrs or {}).items():
        h.attrs[k] = v
    return h


def payload_chunks(tensors: Sequence[tuple[str, torch.Tensor]], chunk_bytes: int) -> Iterator[list[memoryview]]:
    """The tensors' raw bytes cut into chunks of `chunk_bytes` (the last one shorter), each as
    the views it is made of, without copying; one empty chunk when there are no bytes at all
    (the stream still carries its header)."""
    pending: list[memoryview] = []
    size = 0
    emitted = False
    for _, t in tensors:
        view = _raw(t)
        pos = 0
        while pos < len(view):
            take = min(chunk_bytes - size, len(view) - pos)
            pending.append(view[pos : pos + take])
            size += take
            pos += take
            if size == chunk_bytes:
                yield pending
                pending, size, emitted = [], 0, True
    if pending or not emitted:
        yield pending


def encode(
    header: pb.StreamHeader,
    tensors: Sequence[tuple[str, torch.Tensor]],
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[pb.Chunk]:
    """Chunks of at most `chunk_bytes` payload; the header rides on the first one."""
    for i, parts in enumerate(payload_chunks(tensors, chunk_bytes)):
        yield pb.Chunk(header=header if i == 0 else None, data=b"".join(parts))


@dataclass
class Received:
    header: pb.StreamHeader
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    wire_bytes: int = 0  # payload + header bytes that arrived
    buffer: np.ndarray | None = None  # the memory the tensors view; hand it back as a spare when done


class Decoder:
    """Feed chunks in order; `finish()` returns the tensors. Refuses more than `max_bytes`."""

    def __init__(self, max_bytes: int, spare: list[np.ndarray] | None = None):
        self.max_bytes = max_bytes
        # Buffers of earlier streams the caller is done with: a model-sized buffer that is new
        # memory costs a page fault per 4 KiB on first touch, more than copying into it.
        self._spare = spare
        self.header: pb.StreamHeader | None = None
        self._buf: np.ndarray | None = None  # uint8, uninitialised: every byte gets written once
        self._pos = 0
        self.wire_bytes = 0

    def feed(self, chunk: pb.Chunk) -> None:
        if self.header is None:
            if not chunk.HasField("header"):
                raise StreamError("no_header", "the first chunk of a stream must carry the header")
            self._start(chunk.header)
            self.wire_bytes += chunk.header.ByteSize()
        elif chunk.HasField("header"):
            raise StreamError("bad_stream", "a header arrived after the first chunk")
        assert self._buf is not None
        data = chunk.data
        end = self._pos + len(data)
        if end > len(self._buf):
            raise StreamError(
                "too_large",
                f"the stream sent more than the {len(self._buf)} bytes its header declared",
            )
        self._buf[self._pos : end] = np.frombuffer(data, dtype=np.uint8)
        self._pos = end
        self.wire_bytes += len(data)

    def _start(self, header: pb.StreamHeader) -> None:
        total = 0
        for spec in header.tensors:
            if spec.dtype not in DTYPES:
                raise StreamError("bad_dtype", f"tensor {spec.name}: dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
            if any(d < 0 for d in spec.shape):
                raise StreamError("bad_shape", f"tensor {spec.name}: negative dimension in {list(spec.shape)}")
            total += nbytes_of(spec)
        if total > self.max_bytes:
            raise StreamError(
                "too_large", f"the header declares {total} bytes, more than the {self.max_bytes} accepted"
            )
        self.header = header
        reuse = [b for b in self._spare or () if b.nbytes == total]
        if reuse:
            self._spare.remove(reuse[0])  # type: ignore[union-attr]
            self._buf = reuse[0]
        else:
            self._buf = np.empty(total, dtype=np.uint8)

    def finish(self) -> Received:
        if self.header is None or self._buf is None:
            raise StreamError("empty", "the stream ended before its header")
        if self._pos != len(self._buf):
            raise StreamError(
                "truncated", f"the stream ended after {self._pos} of {len(self._buf)} declared bytes"
            )
        out: list[tuple[str, torch.Tensor]] = []
        offset = 0
        for spec in self.header.tensors:
            n = nbytes_of(spec)
            dtype = DTYPES[spec.dtype]
            count = n // dtype.itemsize
            t = (
                torch.frombuffer(memoryview(self._buf), dtype=dtype, count=count, offset=offset)
                if count
                else torch.empty(0, dtype=dtype)
            )
            out.append((spec.name, t.reshape(tuple(spec.shape))))
            offset += n
        return Received(header=self.header, tensors=out, wire_bytes=self.wire_bytes, buffer=self._buf)


def decode_all(chunks: Iterable[pb.Chunk], max_bytes: int) -> Received:
    d = Decoder(max_bytes)
    for c in chunks:
        d.feed(c)
    return d.finish()


async def decode_stream(
    chunks: AsyncIterator[pb.Chunk], max_bytes: int, spare: list[np.ndarray] | None = None
) -> Received:
    d = Decoder(max_bytes, spare)
    async for c in chunks:
        d.feed(c)
    return d.finish()
