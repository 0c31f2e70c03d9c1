"""What a checkpoint may hold, and how it is read back: tensors and plain values, never code.

A checkpoint directory or bucket can be written by more than the process that reads it back (a
pod of a replaced gang, anyone with write access to the volume or the bucket), and an unpickler
calls whatever a pickle names. So nothing here unpickles with the standard loader:

- torch files (whole.py's state.pt, sharded.py's extra.pt, DCP's non-tensor items, rank_state's
  per-rank parts), and the state a fault-tolerant replica receives from a live peer
  (`load_stream`), are read with `torch.load(weights_only=True)`: tensors, dicts, lists, tuples,
  str, int, float, bool, None, OrderedDict, torch.Size and dtypes; torch's own allow-list, with
  nothing added (`load`, `loads`).
- DCP's `.metadata` (a plain pickle of DCP's metadata dataclasses) is read by an Unpickler that
  resolves only the names in METADATA_GLOBALS: those dataclasses, torch.Size, dtypes, layouts and
  a path (`load_metadata`, `SafeReader`).
- What is saved goes through `plain` first: numpy scalars become Python numbers, and any other
  value the loader would refuse is an error naming its key, so a checkpoint that saves also loads.

A file that holds anything else (a planted pickle, or a checkpoint of an older disttrain whose
numpy RNG state was pickled as arrays) raises UnsafeCheckpoint naming the file and the global it
names; the caller moves such a checkpoint aside like a damaged one (directory.quarantine).
"""

from __future__ import annotations

import io
import pathlib
import pickle
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch.distributed._serialization import _streaming_load
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

__all__ = ["SafeLoadPlanner", "SafeReader", "UnsafeCheckpoint", "dumps", "load", "load_metadata", "load_stream", "loads",
           "plain", "tensor_bytes"]


class UnsafeCheckpoint(ValueError):
    """A checkpoint file that only a loader able to run code would read: refused, never unpickled."""


STREAM_SLICE = 1 << 20  # bytes a peer's stream is read in (load_stream)
_GLOBAL = re.compile(r"Unsupported global: (?:GLOBAL )?([\w.]+)")


def _refusal(where: object, e: BaseException, *, stored: bool = True) -> UnsafeCheckpoint:
    named = _GLOBAL.search(str(e))
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    # torch's own advice (allow-list the global) is not this file's way out: it is not to be trusted.
    detail = f"it names {named.group(1)}" if named else (lines[0] if lines else type(e).__name__)[:200]
    older = (" Checkpoints of disttrain before safe checkpoints (meta.json format 1, numpy RNG state pickled as "
             "arrays) read this way too: see the README, 'Checkpoints: what is read back'") if stored else ""
    return UnsafeCheckpoint(
        f"{where} holds Python objects beyond tensors and plain values ({detail}); refused unread: unpickling it "
        f"could run code.{older}"
    )


def load(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """A torch file read with the weights-only unpickler; UnsafeCheckpoint if it names anything else."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refusal(path, e) from None


def dumps(obj: Any) -> bytes:
    """`obj` (tensors and plain values) as the bytes `loads` reads back."""
    buf = io.BytesIO()
    torch.save(plain(obj), buf)
    return buf.getvalue()


def loads(data: bytes, where: str = "a peer's bytes") -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refusal(where, e) from None


class _BoundedStream:
    """A peer's stream read in slices of at most STREAM_SLICE bytes, refused past `limit` bytes and
    after `timeout_s`. torch's streaming reader asks for each record by the length the sender wrote,
    and a file object allocates what it is asked for: a forged length would exhaust the reader's
    memory, a peer that trickles bytes would hold it for ever."""

    def __init__(self, f: Any, *, where: str, limit: int, timeout_s: float) -> None:
        self.f, self.where, self.limit, self.timeout_s = f, where, limit, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.done = 0

    def _admit(self, n: int) -> None:
        if self.done + n > self.limit:
            raise UnsafeCheckpoint(f"{self.where} is larger than the {self.limit} bytes a replica's state can be "
                                   f"(asked for {self.done + n}); refused")  # fmt: skip
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"{self.where} did not arrive within {self.timeout_s:g} s ({self.done} bytes came)")

    def read(self, n: int | None = -1) -> bytearray:
        """Writable bytes: torch makes the received tensors' storage of them, and an optimizer that
        loads its moments keeps those tensors and updates them in place."""
        whole = n is None or n < 0
        want = self.limit - self.done + 1 if whole else int(n)  # type: ignore[arg-type]
        if not whole:
            self._admit(want)
        out = bytearray()
        while want > 0:
            part = self.f.read1(min(STREAM_SLICE, want))
            if not part:
                break
            self._admit(len(part))
            self.done += len(part)
            want -= len(part)
            out += part
        return out

    def readline(self, size: int | None = -1) -> bytes:
        """A byte at a time (the unpickler reads a few short lines: the names of the globals in the
        stream's header), so that the deadline holds within a line that never ends."""
        cap = STREAM_SLICE if size is None or size < 0 else size
        line = bytearray()
        while len(line) < cap and (c := self.read(1)):
            line += c
            if c == b"\n":
                break
        return bytes(line)


def load_stream(f: IO[bytes], where: str, *, limit: int, timeout_s: float) -> Any:
    """What a peer streams in torch's streaming format (torch.distributed's `_streaming_save`: the
    fault-tolerant replicas' state transfer), read with the weights-only unpickler, at most `limit`
    bytes within `timeout_s` (`f` has read1, as an HTTP response does)."""
    try:
        return _streaming_load(_BoundedStream(f, where=where, limit=limit, timeout_s=timeout_s),  # type: ignore[arg-type]
                               map_location="cpu", weights_only=True)  # fmt: skip
    except pickle.UnpicklingError as e:
        raise _refusal(where, e, stored=False) from None


def tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a state tree (dicts, lists, tuples)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(tensor_bytes(v) for v in state)
    return 0


# ------------------------------------------------------------------ saving


_LEAVES = (str, int, float, bool, bytes, type(None), torch.dtype, torch.device)


def plain(obj: Any, where: str = "state") -> Any:
    """`obj` with numpy scalars as Python numbers; TypeError naming the key of any value that the
    weights-only loader would refuse (a numpy array, an object), before anything is written."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj) in _LEAVES:
        return obj
    if isinstance(obj, torch.Size):
        return obj
    if type(obj) in (dict, OrderedDict):
        out = {k: plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
        for k in out:
            if type(k) not in (str, int, float, bool, type(None)):
                raise TypeError(f"checkpoint {where}: key {k!r} of type {type(k).__name__} is not a plain value")
        return OrderedDict(out) if type(obj) is OrderedDict else out
    if type(obj) in (list, tuple):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if type(obj) is list else tuple(items)
    raise TypeError(
        f"checkpoint {where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be saved: checkpoints "
        "hold tensors and plain values only (str, int, float, bool, None, lists, tuples, dicts), which is what "
        "they are read back with (checkpoints/safe_state.py)"
    )


# ------------------------------------------------------------------ DCP metadata


def _dtypes() -> dict[tuple[str, str], Any]:
    return {("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


# The names DCP's .metadata pickle may resolve (found by unpickling what dcp.save writes for
# replicated, FSDP2 and tensor-parallel models with SGD and AdamW state). Data classes only:
# constructing any of them runs no code of the file's choosing.
METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    **{(dcp_metadata.__name__, n): getattr(dcp_metadata, n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")},
    (dcp_filesystem.__name__, "_StorageInfo"): dcp_filesystem._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "Path"): pathlib.Path,
    ("collections", "OrderedDict"): OrderedDict,
    **_dtypes(),
}  # fmt: skip


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = METADATA_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"Unsupported global: {module}.{name} is not one of DCP's metadata classes")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("Unsupported persistent id in DCP metadata")


def load_metadata(stream: IO[bytes], where: object) -> dcp_metadata.Metadata:
    """DCP's .metadata from `stream`, resolving only METADATA_GLOBALS; UnsafeCheckpoint otherwise."""
    try:
        metadata = _MetadataUnpickler(stream).load()
    except pickle.UnpicklingError as e:
        raise _refusal(where, e) from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise UnsafeCheckpoint(f"{where} holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file reader with `.metadata` read by load_metadata (tensors it reads weights-only already)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream, path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner with its non-tensor items (optimizer hyperparameters) read
    weights-only; the default reads them with a full unpickler."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise _refusal(f"DCP item {read_item.dest_index.fqn}", e) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
