"""format npz: the arrays `features` and `labels` of one archive, converted once into the cache,
streamed a batch of rows at a time out of the archive's members (compressed or not): the arrays
are never whole in memory."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..convert import BATCH_ROWS, check_batch
from ..dataset import Dataset
from ..rows import converted
from ..source import Source


def _header(member: IO[bytes], path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(member)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(member)
    if dtype.hasobject:
        raise ConfigError(f"spec.data.path: array {key!r} of {path} holds Python objects; save numbers")
    if fortran and len(shape) > 1:
        raise ConfigError(f"spec.data.path: array {key!r} of {path} is in Fortran order; save it with "
                          "np.ascontiguousarray so its rows can be read one batch at a time")  # fmt: skip
    return shape, dtype


def _rows(member: IO[bytes], shape: tuple[int, ...], dtype: np.dtype, path: Path, key: str) -> Iterator[np.ndarray]:
    row_items = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    row_bytes = max(1, row_items * dtype.itemsize)
    left = shape[0] if shape else 1
    while left > 0:
        n = min(BATCH_ROWS, left)
        data = member.read(n * row_bytes)
        if len(data) != n * row_bytes:
            raise ConfigError(f"spec.data.path: array {key!r} of {path} ends early: is the archive truncated?")
        yield np.frombuffer(data, dtype=dtype).reshape(n, *shape[1:]) if shape else np.frombuffer(data, dtype=dtype)
        left -= n


def _batches(d: DataSpec, path: Path | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    assert path is not None, "validation requires data.path with format npz"
    try:
        with zipfile.ZipFile(path) as z:
            keys = [n[: -len(".npy")] for n in z.namelist() if n.endswith(".npy")]
            missing = [k for k in (d.features, d.labels) if k not in keys]
            if missing:
                field = "spec.data.features" if d.features in missing else "spec.data.labels"
                raise ConfigError(f"{field}: {path} has no array {missing[0]!r} (it holds {', '.join(keys) or 'none'})")
            with z.open(f"{d.features}.npy") as fx, z.open(f"{d.labels}.npy") as fy:
                x_shape, x_dtype = _header(fx, path, d.features)
                y_shape, y_dtype = _header(fy, path, d.labels)
                # The whole arrays' shapes and dtypes first (broadcast views: nothing is allocated).
                check_batch(np.broadcast_to(np.zeros((), x_dtype), x_shape),
                            np.broadcast_to(np.zeros((), y_dtype), y_shape), str(path), float_labels=False)  # fmt: skip
                yield from zip(_rows(fx, x_shape, x_dtype, path, d.features),
                               _rows(fy, y_shape, y_dtype, path, d.labels), strict=True)  # fmt: skip
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"spec.data.path: {path} is not a readable .npz archive ({e}); is it truncated?") from None


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    d = spec.data
    return converted(spec, src, cache, _batches, {"features": d.features, "labels": d.labels})
