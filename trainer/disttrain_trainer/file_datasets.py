"""Your own data (spec.data.path + format), read where it lies and checked before training.

tokens and npy files are memory-mapped in place: a rank reads only the rows of its slice of
each global batch, never the whole file. npz, parquet, jsonl and module datasets are converted
once into x.npy / y.npy in the shard cache (file_converters.py), keyed by the source's path,
size and mtime so a changed file is converted again, and then read like npy. Every problem a
file can have (missing, truncated, wrong dtype, token ids past the vocabulary, labels outside
the classes) is a ConfigError naming the file and what is wrong: the job fails at once with
exit 2 instead of crashing mid-run or training on garbage.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from . import file_converters, object_store, remote_tokens
from .data_cache import build_once
from .process.config import ConfigError

FILE_FORMAT_VERSION = 1
SPLIT_SEED = 0  # the held-out rows must not change with data.seed
EVAL_WINDOWS = 128  # validation windows of a token file, evenly spaced
MAX_EVAL_ROWS = 10_000  # held-out rows of classification data the evaluation reads
SCAN_CHUNK = 1 << 24  # elements per read of the one-off max scan: bounded memory on any file size


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
            mm = np.memmap(self.path, dtype=self.dtype, mode="r")
            object.__setattr__(self, "_mm", mm)
        return mm

    def take(self, rows: np.ndarray) -> np.ndarray:
        # One gather for the whole batch: only the pages under these windows are read.
        idx = self.start + np.asarray(rows, dtype=np.int64)[:, None] + np.arange(self.block_size + 1)
        return np.asarray(self._map()[idx])


@dataclass(frozen=True, kw_only=True)
class Rows:
    """Rows of a memory-mapped .npy array selected through `index` (the training split)."""

    path: Path
    index: np.ndarray  # training row -> row of the file
    dtype: str  # what the model reads: float32 features, int64 labels

    def take(self, rows: np.ndarray) -> np.ndarray:
        mm = self.__dict__.get("_mm")
        if mm is None:
            mm = np.load(self.path, mmap_mode="r")
            object.__setattr__(self, "_mm", mm)
        return np.asarray(mm[self.index[np.asarray(rows)]], dtype=self.dtype)


@dataclass(frozen=True, kw_only=True)
class FileData:
    """What datasets.Dataset is built from."""

    name: str
    kind: Literal["classify", "lm"]
    num_train: int
    num_classes: int
    input_dim: int
    train_x: TokenFile | Rows | remote_tokens.RemoteTokenFile
    train_y: Rows | None
    test_x: np.ndarray
    test_y: np.ndarray | None


def resolve_path(d: DataSpec) -> Path:
    """data.path as the trainer reads it: relative paths lie under the data volume's mount.
    (disttrain local makes them absolute first, against the manifest's folder.)"""
    p = Path(d.path or "")
    return p if p.is_absolute() else Path(d.mount_path) / p


def fingerprint(path: Path) -> list[Any]:
    """Path, size and mtime of a file, or of every file under a directory: a change repacks."""
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    return [[str(f.resolve()), (st := f.stat()).st_size, st.st_mtime_ns] for f in files]


def _cached_json(cache: Path, key: dict[str, Any], compute: Any) -> Any:
    """compute() once per key, kept in the cache dir (written atomically; ranks may race)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    target = cache / f"scan-{digest}.json"
    if target.exists():
        return json.loads(target.read_text())
    value = compute()
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=cache)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)
    os.replace(tmp, target)
    return value


def _min_max(arr: np.ndarray) -> list[int]:
    lo, hi = None, None
    for i in range(0, len(arr), SCAN_CHUNK):
        chunk = np.asarray(arr[i : i + SCAN_CHUNK])
        lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
        hi = int(chunk.max()) if hi is None else max(hi, int(chunk.max()))
    return [lo or 0, hi or 0]


# ------------------------------------------------------------------ tokens


def _token_map(path: Path, dtype: str, what: str) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(f"spec.data.path: {what} {path} does not exist (or is not a file)")
    size, item = path.stat().st_size, np.dtype(dtype).itemsize
    if size == 0 or size % item:
        raise ConfigError(
            f"spec.data.path: {path} holds {size} bytes, not a whole number of {dtype} token ids "
            f"({item} bytes each): the file is truncated or spec.data.tokenDtype is wrong"
        )
    return np.memmap(path, dtype=dtype, mode="r")


def _tokens(spec: JobSpec, path: Path, cache: Path) -> FileData:
    d, block = spec.data, spec.model.block_size
    if path.is_dir():
        train_path, val_path = path / d.train_file, path / d.validation_file
        if not val_path.is_file():
            val_path = None
    else:
        train_path, val_path = path, None
    train = _token_map(train_path, d.token_dtype, "the training token file")
    val = _token_map(val_path, d.token_dtype, "the validation token file") if val_path else None
    files = [p for p in (train_path, val_path) if p is not None]
    lo_hi = _cached_json(cache, {"v": FILE_FORMAT_VERSION, "scan": "tokens", "dtype": d.token_dtype,
                                 "files": [fingerprint(p) for p in files]},
                         lambda: [_min_max(np.memmap(p, dtype=d.token_dtype, mode="r")) for p in files])  # fmt: skip
    top = max(hi for _, hi in lo_hi)
    vocab = d.vocab_size or top + 1
    if top >= vocab:
        where = files[[hi for _, hi in lo_hi].index(top)]
        raise ConfigError(
            f"spec.data.vocabSize: {where} holds token id {top}, outside the vocabulary of {vocab}; "
            f"raise vocabSize to at least {top + 1} (or leave it 0 to take the largest id + 1)"
        )
    start, train_tokens = 0, len(train)
    if val is None:  # nanoGPT's layout without val.bin: hold out the tail
        train_tokens = int(len(train) * (1 - d.validation_fraction))
        val, val_path = train[train_tokens:], train_path
    for what, n, p in (("training", train_tokens, train_path), ("validation", len(val), val_path)):
        if n < block + 2:
            raise ConfigError(
                f"spec.data.path: {p} has {n} {what} tokens, fewer than one window of model.blockSize "
                f"{block} + 2; give more tokens or a smaller blockSize"
            )
    starts = np.linspace(0, len(val) - block - 2, EVAL_WINDOWS).astype(np.int64)
    test_x = np.stack([np.asarray(val[s : s + block + 1]) for s in starts]).astype(np.int64)
    windows = train_tokens - block - 1
    src = TokenFile(path=train_path, dtype=d.token_dtype, start=start, windows=windows, block_size=block)
    return FileData(name=str(path), kind="lm", num_train=windows, num_classes=vocab, input_dim=block,
                    train_x=src, train_y=None, test_x=test_x, test_y=None)  # fmt: skip


# -------------------------------------------------------------------- rows


def load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(f"spec.data.path: the {what} file {path} does not exist (or is not a file)")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"spec.data.path: {path} is not a readable .npy file ({e}); is it truncated?") from None


def check_rows(x: np.ndarray, y: np.ndarray, where: str) -> None:
    """Shapes and dtypes of feature and label arrays, whatever file they came from."""
    if x.ndim < 2:
        raise ConfigError(f"spec.data.path: features in {where} have shape {x.shape}; give one row per sample: "
                          "shape (samples, features...), e.g. reshape(-1, 1) for one feature")
    if x.dtype.kind not in "fiub":
        raise ConfigError(f"spec.data.path: features in {where} have dtype {x.dtype}; they must be numbers")
    if y.ndim != 1:
        raise ConfigError(f"spec.data.path: labels in {where} have shape {y.shape}; give one class index per "
                          "sample: shape (samples,)")
    if y.dtype.kind not in "iu":
        raise ConfigError(f"spec.data.path: labels in {where} have dtype {y.dtype}; classification labels must "
                          "be integer class indices")
    if len(x) != len(y):
        raise ConfigError(f"spec.data.path: {where} has {len(x)} feature rows but {len(y)} labels")
    if len(x) < 2:
        raise ConfigError(f"spec.data.path: {where} has {len(x)} samples; training and evaluation need at least 2")


def _npy_files(d: DataSpec, path: Path) -> tuple[Path, Path]:
    if not path.is_dir():
        raise ConfigError(f"spec.data.path: {path} is not a directory; format npy reads "
                          f"{d.features}.npy and {d.labels}.npy inside one")
    name = lambda stem: stem if stem.endswith(".npy") else f"{stem}.npy"  # noqa: E731
    return path / name(d.features), path / name(d.labels)


def _rows(spec: JobSpec, x_path: Path, y_path: Path, cache: Path, where: str) -> FileData:
    d = spec.data
    x, y = load_npy(x_path, "feature"), load_npy(y_path, "label")
    check_rows(x, y, where)
    lo, hi = _cached_json(cache, {"v": FILE_FORMAT_VERSION, "scan": "labels", "file": fingerprint(y_path)},
                          lambda: _min_max(y))  # fmt: skip
    classes = d.classes or hi + 1
    if lo < 0 or hi >= classes:
        field = "spec.data.classes" if d.classes and lo >= 0 else "spec.data.path"
        raise ConfigError(
            f"{field}: labels in {where} span [{lo}, {hi}], outside [0, {classes}): labels are class indices "
            "0 .. classes - 1"
        )
    n = len(x)
    held = max(1, int(n * d.validation_fraction))
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    train_idx, test_idx = np.sort(perm[held:]), np.sort(perm[:held][:MAX_EVAL_ROWS])
    test_x = np.asarray(x[test_idx], dtype=np.float32)
    test_y = np.asarray(y[test_idx], dtype=np.int64)
    return FileData(
        name=where, kind="classify", num_train=len(train_idx), num_classes=classes,
        input_dim=int(np.prod(x.shape[1:])), train_x=Rows(path=x_path, index=train_idx, dtype="float32"),
        train_y=Rows(path=y_path, index=train_idx, dtype="int64"), test_x=test_x, test_y=test_y,
    )  # fmt: skip


def _converted(spec: JobSpec, path: Path, cache: Path) -> FileData:
    """npz, parquet, jsonl and module data: converted once into x.npy / y.npy in the cache."""
    d = spec.data
    source = fingerprint(path) if d.path else []
    key = {"v": FILE_FORMAT_VERSION, "format": d.format, "source": source, "features": d.features,
           "labels": d.labels, "columns": list(d.feature_columns), "label": d.label_column, "factory": d.factory,
           "module": file_converters.module_fingerprint(d.factory or "")}  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    target = cache / f"{d.format}-{digest}"

    def convert(tmp: Path) -> None:
        x, y = file_converters.read_rows(d, path)
        check_rows(x, y, str(path) if d.path else str(d.factory))
        np.save(tmp / "x.npy", np.ascontiguousarray(x))
        np.save(tmp / "y.npy", np.ascontiguousarray(y))

    build_once(target, convert, done="y.npy")
    return _rows(spec, target / "x.npy", target / "y.npy", cache, str(path) if d.path else str(d.factory))


def _remote_tokens(spec: JobSpec, cache: Path) -> FileData:
    """format tokens at an s3:// URI: windows read by ranged GETs where the object lies (remote_tokens.py)."""
    block = spec.model.block_size
    r = remote_tokens.remote_tokens(spec, cache)
    window = lambda uri, start, n: remote_tokens.RemoteTokenFile(  # noqa: E731
        store=r["store"], uri=uri, dtype=spec.data.token_dtype, start=start, windows=n, block_size=block)
    starts = np.linspace(0, r["val_len"] - block - 2, EVAL_WINDOWS).astype(np.int64)
    test_x = window(r["val_uri"], r["val_start"], r["val_len"] - block - 1).fetch(starts).astype(np.int64)
    windows = r["train_tokens"] - block - 1
    return FileData(name=str(spec.data.path), kind="lm", num_train=windows, num_classes=r["vocab"], input_dim=block,
                    train_x=window(r["train_uri"], 0, windows), train_y=None, test_x=test_x, test_y=None)  # fmt: skip


def load_file_data(spec: JobSpec, cache: Path) -> FileData:
    d = spec.data
    if object_store.is_uri(d.path):
        # tokens are read in place, window by window; the other formats are read whole anyway:
        # staged once per pod into the cache, then read like a local file.
        if d.format == "tokens":
            return _remote_tokens(spec, cache)
        path = object_store.stage(spec, cache)
        if d.format == "npy":
            x_path, y_path = _npy_files(d, path)
            return _rows(spec, x_path, y_path, cache, str(d.path))
        return _converted(spec, path, cache)
    path = resolve_path(d)
    if d.path and not path.exists():
        hint = "" if Path(d.path).is_absolute() else f" (relative paths resolve under spec.data.mountPath {d.mount_path})"
        raise ConfigError(f"spec.data.path: {path} does not exist{hint}")
    if d.format == "tokens":
        return _tokens(spec, path, cache)
    if d.format == "npy":
        x_path, y_path = _npy_files(d, path)
        return _rows(spec, x_path, y_path, cache, str(path))
    return _converted(spec, path, cache)
