"""Rows converted in record batches: the formats that cannot be memory-mapped as they lie (npz,
parquet, jsonl, csv, a module's Dataset, an image folder, a Hugging Face dataset) hand over their
rows a batch at a time, and each batch is appended to x.npy / y.npy. Peak memory is a batch, on
a file of any size.

The .npy files are written front to back with plain writes: the header first, with the row
count 0 (numpy reserves room in every header for axis 0 to grow to 21 digits), then each batch,
then the header again with the real count. One pass, so formats without a row count in their
metadata (CSV, JSON lines) need no counting pass; and no memory map of the output, whose written
pages would count in the converter's resident set until it exits.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..process.config import ConfigError

# Rows per record batch a format reads at once: a batch of wide rows (images) stays a few tens of MiB.
BATCH_ROWS = 4096


class NpyAppender:
    """One .npy file written a batch of rows at a time; the first batch fixes dtype and row shape."""

    def __init__(self, path: Path):
        self.path = path
        self.rows = 0
        self.dtype: np.dtype | None = None
        self.row_shape: tuple[int, ...] = ()
        self._f: BinaryIO | None = None
        self._header_len = 0

    def _header(self) -> bytes:
        assert self.dtype is not None
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                   "fortran_order": False, "shape": (self.rows, *self.row_shape)})  # fmt: skip
        return buf.getvalue()

    def append(self, batch: np.ndarray) -> None:
        if self._f is None:
            self.dtype, self.row_shape = batch.dtype, tuple(batch.shape[1:])
            self._f = open(self.path, "wb")  # noqa: SIM115 - closed by close(), after the last batch
            header = self._header()
            self._header_len = len(header)
            self._f.write(header)
        self._f.write(np.ascontiguousarray(batch, dtype=self.dtype).tobytes())
        self.rows += len(batch)

    def close(self) -> None:
        """Write the real row count into the header (same length: numpy keeps room for it)."""
        if self._f is None:
            return
        header = self._header()
        if len(header) != self._header_len:
            raise RuntimeError(f"{self.path}: the .npy header grew from {self._header_len} to {len(header)} bytes")
        self._f.seek(0)
        self._f.write(header)
        self._f.close()
        self._f = None


@dataclass(frozen=True, kw_only=True)
class Written:
    rows: int
    row_shape: tuple[int, ...]


def check_batch(x: np.ndarray, y: np.ndarray, where: str, *, float_labels: bool) -> None:
    """Shapes and dtypes of a batch of feature rows and their labels, whatever file they came from."""
    if x.ndim < 2:
        raise ConfigError(f"spec.data.path: features in {where} have shape {x.shape}; give one row per sample: "
                          "shape (samples, features...), e.g. reshape(-1, 1) for one feature")
    if x.dtype.kind not in "fiub":
        raise ConfigError(f"spec.data.path: features in {where} have dtype {x.dtype}; they must be numbers")
    if y.ndim != 1:
        what = "one target per sample" if float_labels else "one class index per sample"
        raise ConfigError(f"spec.data.path: labels in {where} have shape {y.shape}; give {what}: shape (samples,)")
    if float_labels:
        if y.dtype.kind not in "fiu":
            raise ConfigError(f"spec.data.path: labels in {where} have dtype {y.dtype}; regression targets "
                              "(training.loss mse) must be numbers")  # fmt: skip
    elif y.dtype.kind not in "iu":
        raise ConfigError(f"spec.data.path: labels in {where} have dtype {y.dtype}; classification labels must "
                          "be integer class indices (for numeric targets set training.loss: mse)")
    if len(x) != len(y):
        raise ConfigError(f"spec.data.path: {where} has {len(x)} feature rows but {len(y)} labels")


def write_rows(batches: Iterable[tuple[np.ndarray, np.ndarray]], out: Path, where: str, *,
               float_labels: bool) -> Written:  # fmt: skip
    """Append every (features, labels) batch to out/x.npy and out/y.npy, checking each one."""
    xs, ys = NpyAppender(out / "x.npy"), NpyAppender(out / "y.npy")
    try:
        for x, y in batches:
            check_batch(x, y, where, float_labels=float_labels)
            if xs.dtype is not None and (x.shape[1:] != xs.row_shape):
                raise ConfigError(f"spec.data.path: {where} has rows of different shapes: {xs.row_shape} and "
                                  f"{tuple(x.shape[1:])} (from row {xs.rows} on)")  # fmt: skip
            if ys.dtype is not None and y.dtype != ys.dtype and not np.can_cast(y.dtype, ys.dtype):
                raise ConfigError(f"spec.data.path: labels in {where} change dtype from {ys.dtype} to {y.dtype} "
                                  f"at row {ys.rows}")  # fmt: skip
            xs.append(x)
            ys.append(y)
    finally:
        xs.close()
        ys.close()
    if xs.rows < 2:
        raise ConfigError(f"spec.data.path: {where} has {xs.rows} samples; training and evaluation need at least 2")
    return Written(rows=xs.rows, row_shape=xs.row_shape)
