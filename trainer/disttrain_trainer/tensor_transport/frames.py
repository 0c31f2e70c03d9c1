"""`Chunk` messages as raw frames: the same bytes on the wire, no protobuf object on the data path.

A serialised `Chunk` is `[0x0a len header] [0x12 len data]` (fields 1 and 2,
length-delimited). Building that by hand costs one copy of the payload (tensor
memory -> the frame), and reading it costs one (the frame -> the destination
tensor), where going through `pb.Chunk` adds a copy into the message, one out of
it and one for serialisation. gRPC methods using frames register no
(de)serialiser for the streamed side (gRPC then passes `bytes` through), and a
peer that speaks `pb.Chunk` reads and writes the very same bytes.

`FrameDecoder` can write straight into caller-owned tensors (a worker's own
parameters), checked against the header before any byte is written.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch

from .codec import CHUNK_BYTES, DTYPES, Received, StreamError, nbytes_of, payload_chunks
from .protos import tensor_transport_pb2 as pb

HEADER_TAG, DATA_TAG = 0x0A, 0x12
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def reuse_freed_memory() -> bool:
    """Have glibc serve chunk-sized blocks from its heap and keep freed pages there.

    By default a block of a few MiB is mmap'ed and unmapped on free, so every frame (and
    every gRPC message buffer) faults in fresh zeroed pages: measured here, 5x the time of
    the copy itself. With the mmap threshold above the chunk size and a high trim threshold,
    the next frame reuses the pages the last one freed. Call once per process, early;
    returns False where glibc is not the allocator (nothing changes then).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise StreamError("bad_frame", "a frame ends inside a length")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def encode(header: pb.StreamHeader, tensors: Sequence[tuple[str, torch.Tensor]],
           chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:  # fmt: skip
    """Serialised `Chunk`s of at most `chunk_bytes` payload; the header rides on the first one."""
    head = header.SerializeToString()
    first: list[bytes | memoryview] = [bytes([HEADER_TAG]), _varint(len(head)), head]
    for parts in payload_chunks(tensors, chunk_bytes):
        size = sum(len(v) for v in parts)
        data = [bytes([DATA_TAG]), _varint(size), *parts] if size else []
        yield b"".join([*first, *data])
        first = []


def split(frame: bytes) -> tuple[pb.StreamHeader | None, memoryview]:
    """(header or None, payload view) of one serialised `Chunk`."""
    buf = memoryview(frame)
    header: pb.StreamHeader | None = None
    data = buf[0:0]
    pos = 0
    while pos < len(buf):
        tag = buf[pos]
        if tag not in (HEADER_TAG, DATA_TAG):
            raise StreamError("bad_frame", f"unexpected field tag {tag:#x} in a chunk")
        n, pos = _read_varint(buf, pos + 1)
        if pos + n > len(buf):
            raise StreamError("bad_frame", "a chunk field runs past the end of its frame")
        if tag == HEADER_TAG:
            header = pb.StreamHeader.FromString(buf[pos : pos + n])
        else:
            data = buf[pos : pos + n]
        pos += n
    return header, data


class FrameDecoder:
    """Feed frames in order; `finish()` returns the tensors. Refuses more than `max_bytes`.

    With `into`, every tensor the header names must be there with the same dtype and shape
    (contiguous); its bytes are written in place and `finish()` returns those tensors.
    """

    def __init__(self, max_bytes: int, into: Mapping[str, torch.Tensor] | None = None):
        self.max_bytes = max_bytes
        self.into = into
        self.header: pb.StreamHeader | None = None
        self.wire_bytes = 0
        self._targets: list[tuple[str, memoryview]] = []  # byte views the payload fills, in order
        self._tensors: list[tuple[str, torch.Tensor]] = []
        self._i = 0  # current target
        self._off = 0  # bytes written into it

    def _start(self, header: pb.StreamHeader) -> None:
        total = 0
        for spec in header.tensors:
            if spec.dtype not in DTYPES:
                raise StreamError("bad_dtype", f"tensor {spec.name}: dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
            if any(d < 0 for d in spec.shape):
                raise StreamError("bad_shape", f"tensor {spec.name}: negative dimension in {list(spec.shape)}")
            total += nbytes_of(spec)
        if total > self.max_bytes:
            raise StreamError("too_large", f"the header declares {total} bytes, more than the {self.max_bytes} accepted")
        for spec in header.tensors:
            dtype, shape = DTYPES[spec.dtype], tuple(spec.shape)
            if self.into is not None:
                t = self.into.get(spec.name)
                if t is None:
                    raise StreamError("unknown_tensor", f"tensor {spec.name!r} is not expected here")
                if t.dtype != dtype:
                    raise StreamError("bad_dtype", f"{spec.name}: dtype {spec.dtype} where {t.dtype} is expected")
                if tuple(t.shape) != shape or not t.is_contiguous():
                    raise StreamError("bad_shape", f"{spec.name}: shape {shape} where {tuple(t.shape)} is expected")
            else:
                t = torch.empty(shape, dtype=dtype)
            self._tensors.append((spec.name, t))
            if t.numel():
                self._targets.append((spec.name, memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())))
        self.header = header

    def feed(self, frame: bytes) -> None:
        header, data = split(frame)
        if self.header is None:
            if header is None:
                raise StreamError("no_header", "the first chunk of a stream must carry the header")
            self._start(header)
            self.wire_bytes += header.ByteSize()
        elif header is not None:
            raise StreamError("bad_stream", "a header arrived after the first chunk")
        self.wire_bytes += len(data)
        pos = 0
        while pos < len(data):
            if self._i >= len(self._targets):
                raise StreamError("too_large", "the stream sent more bytes than its header declared")
            _, dest = self._targets[self._i]
            take = min(len(dest) - self._off, len(data) - pos)
            dest[self._off : self._off + take] = data[pos : pos + take]
            self._off += take
            pos += take
            if self._off == len(dest):
                self._i, self._off = self._i + 1, 0

    def finish(self) -> Received:
        if self.header is None:
            raise StreamError("empty", "the stream ended before its header")
        if self._i != len(self._targets):
            raise StreamError("truncated", "the stream ended before all the bytes its header declared")
        return Received(header=self.header, tensors=self._tensors, wire_bytes=self.wire_bytes)


def decode_all(frames: Iterable[bytes], max_bytes: int, into: Mapping[str, torch.Tensor] | None = None) -> Received:
    d = FrameDecoder(max_bytes, into)
    for f in frames:
        d.feed(f)
    return d.finish()
