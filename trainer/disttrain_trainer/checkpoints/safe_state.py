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
           "plain"]


class UnsafeCheckpoint(ValueError):
    """A checkpoint file that only a loader able to run code would read: refused, never unpickled."""


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


def load_stream(f: IO[bytes], where: str) -> Any:
    """What a peer streams in torch's streaming format (torch.distributed's `_streaming_save`: the
    fault-tolerant replicas' state transfer), read with the weights-only unpickler."""
    try:
        return _streaming_load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refusal(where, e, stored=False) from None


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
