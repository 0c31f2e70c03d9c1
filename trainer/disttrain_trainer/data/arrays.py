"""Row sources on local files, memory-mapped: a rank reads only the rows of its slice of each
global batch, never a whole file.

Shards and TokenWindows: the built-in datasets, packed into a few .npy shard files. TokenFile: a
flat token file (format tokens, or a tokenized text column). Rows: one .npy array through a
seeded permutation (the training split of your own rows).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .permutation import Permutation

IN_MEMORY_MAX_BYTES = 64 << 20  # shards smaller than this are read into memory once per process
INDEX_TABLE_MAX = 1 << 20  # files of at most this many rows keep their split as a table (8 MiB at most)
SCAN_CHUNK_BYTES = 4 << 20  # bytes per read of a one-off scan: bounded memory on any file size


def _mapped(path: Path) -> mmap.mmap:
    """A read-only map of `path` advised for random access: a read faults in its own pages only, not
    the kernel's readahead around them, which would count in the process's resident set (rows of a
    large file read at random would otherwise map most of it)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mm.madvise(mmap.MADV_RANDOM)
    return mm


def map_tokens(path: Path, dtype: str) -> np.ndarray:
    """A flat file of `dtype` values, memory-mapped for random reads."""
    return np.frombuffer(_mapped(path), dtype=dtype)


def map_npy(path: Path) -> np.ndarray:
    """An .npy file's array, memory-mapped for random reads (numpy's header parsed by numpy)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError("the array holds Python objects")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(_mapped(path), dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C")


def read_npy_rows(path: Path, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of an .npy file (C order) read with pread, not through a memory map: the kernel
    maps the pages around each faulted page of a cached file into the process (fault-around), so
    a few thousand rows scattered over a large file would put most of it in the resident set."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        offset = f.tell()
        if fortran and len(shape) > 1:  # rows are not contiguous: read them through the map
            return np.asarray(map_npy(path)[rows])
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        out = np.empty((len(rows), *shape[1:]), dtype=dtype)
        view = out.reshape(len(rows), -1).view(np.uint8) if row_bytes else out
        for i, r in enumerate(np.asarray(rows, dtype=np.int64).tolist()):
            data = os.pread(f.fileno(), row_bytes, offset + r * row_bytes)
            if len(data) != row_bytes:
                raise ValueError(f"row {r} is past the end of the file")
            view[i] = np.frombuffer(data, dtype=np.uint8)
        return out


@dataclass(frozen=True, kw_only=True)
class Shards:
    """Rows of one logical array spread over shard files; read lazily through mmap."""

    files: tuple[Path, ...]
    rows_per_shard: int
    total_rows: int

    def _maps(self) -> list[np.ndarray]:
        cache = self.__dict__.get("_cache")
        if cache is None:
            cache = [np.load(f, mmap_mode="r") for f in self.files]
            object.__setattr__(self, "_cache", cache)
        return cache

    def _joined(self) -> np.ndarray | None:
        """All shards as one in-memory array when they are small (the reads run every step:
        one fancy index into one array costs ~10 us, a per-shard gather ~10x that)."""
        if "_joined_cache" not in self.__dict__:
            maps = self._maps()
            small = sum(m.nbytes for m in maps) <= IN_MEMORY_MAX_BYTES
            object.__setattr__(self, "_joined_cache", np.concatenate(maps) if small else None)
        return self.__dict__["_joined_cache"]

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        joined = self._joined()
        if joined is not None:
            return joined[rows]
        # Large data stays memory-mapped: one fancy-indexed read per shard, not one per row.
        maps = self._maps()
        shard, offset = np.divmod(rows, self.rows_per_shard)
        out = np.empty((len(rows), *maps[0].shape[1:]), dtype=maps[0].dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = maps[s][offset[sel]]
        return out


@dataclass(frozen=True, kw_only=True)
class TokenWindows:
    """Language-model windows over token shards: sample i = tokens[i : i + block + 1] (shards overlap by block+1)."""

    files: tuple[Path, ...]
    windows_per_shard: int
    total_windows: int
    block_size: int

    def take(self, rows: np.ndarray) -> np.ndarray:
        maps = self.__dict__.get("_cache")
        if maps is None:
            maps = [np.load(f, mmap_mode="r") for f in self.files]
            object.__setattr__(self, "_cache", maps)
        out = []
        for r in rows:
            s, o = divmod(int(r), self.windows_per_shard)
            out.append(np.asarray(maps[s][o : o + self.block_size + 1]))
        return np.stack(out)


@dataclass(frozen=True, kw_only=True)
class TokenFile:
    """Language-model windows over a memory-mapped token file: sample i = tokens[start + i : + block + 1]."""

    path: Path
    dtype: str
    start: int  # first token of this split
    windows: int
    block_size: int

    def _map(self) -> np.ndarray:
        mm = self.__dict__.get("_mm")
        if mm is None:
            mm = map_tokens(self.path, self.dtype)
            object.__setattr__(self, "_mm", mm)
        return mm

    def take(self, rows: np.ndarray) -> np.ndarray:
        # One gather for the whole batch: only the pages under these windows are read.
        idx = self.start + np.asarray(rows, dtype=np.int64)[:, None] + np.arange(self.block_size + 1)
        return np.asarray(self._map()[idx])


@dataclass(frozen=True, kw_only=True)
class Rows:
    """Rows of a memory-mapped .npy array: training row i is row order(offset + i) of the file (the
    training split of a seeded permutation, whose first `offset` images are held out)."""

    path: Path
    order: Permutation
    offset: int
    dtype: str  # what the model reads: float32 features, int64 labels (float32 for a regression)
    scale: float | None = None  # multiply as read (uint8 image pixels -> [0, 1])

    def _file_rows(self, rows: np.ndarray) -> np.ndarray:
        if self.order.n > INDEX_TABLE_MAX:  # evaluated per row: nothing the size of the file is held
            return self.order(self.offset + np.asarray(rows, dtype=np.int64))
        table = self.__dict__.get("_table")
        if table is None:  # small: one table lookup per step beats the network's few dozen numpy calls
            table = self.order.table()[self.offset :]
            object.__setattr__(self, "_table", table)
        return table[np.asarray(rows)]

    def take(self, rows: np.ndarray) -> np.ndarray:
        mm = self.__dict__.get("_mm")
        if mm is None:
            mm = map_npy(self.path)
            object.__setattr__(self, "_mm", mm)
        out = np.asarray(mm[self._file_rows(rows)], dtype=self.dtype)
        if self.scale is not None:
            out *= np.float32(self.scale)
        return out


def file_min_max(path: Path, dtype: str, *, offset: int = 0) -> list[int]:
    """Smallest and largest value of the `dtype` values from byte `offset` to the end of a file,
    read in chunks of SCAN_CHUNK_BYTES through the file, not a memory map (whose pages would stay
    in the process's resident set): bounded memory on any file size. [0, 0] when it holds none."""
    lo, hi = None, None
    item = np.dtype(dtype).itemsize
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = np.fromfile(f, dtype=dtype, count=SCAN_CHUNK_BYTES // item)
            if not len(chunk):
                break
            lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
            hi = int(chunk.max()) if hi is None else max(hi, int(chunk.max()))
    return [lo or 0, hi or 0]


def npy_data_offset(path: Path) -> int:
    """Where the values of an .npy file start (after its header)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
        return f.tell()
