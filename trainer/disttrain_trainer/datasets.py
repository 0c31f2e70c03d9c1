"""Datasets packed into a few shard files, and a deterministic, resumable sampler.

Shards are .npy files memory-mapped by every rank, so a rank touches only the
rows of its own slice of each global batch. The sampler walks one seeded
permutation of the whole training set per epoch; rank r of W takes the r-th
W-th of every global batch, which makes W processes see exactly the samples one
process would see with the same global batch (and lets a checkpoint written at
world size 2 resume at world size 1: the position is global).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any, Literal

import numpy as np
from disttrain_api import constants as C
from disttrain_api.model import JobSpec

from .data_cache import build_once
from .file_datasets import Rows, TokenFile, load_file_data
from .process.config import ConfigError
from .remote_tokens import RemoteTokenFile

FORMAT_VERSION = 1
TEST_FRACTION = 0.2
SPLIT_SEED = 0  # fixed: the test set must not change with data.seed
TEXT_VAL_FRACTION = 0.1
TEXT_EVAL_WINDOWS = 128
SYNTHETIC_FEATURES = 64
SYNTHETIC_CLASSES = 10
IN_MEMORY_MAX_BYTES = 64 << 20  # shards smaller than this are read into memory once per process


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
class Dataset:
    name: str
    kind: Literal["classify", "lm"]
    num_train: int
    num_classes: int  # classes, or vocabulary size for "lm"
    input_dim: int  # features per sample (classify) or block size (lm)
    train_x: Shards | TokenWindows | TokenFile | Rows | RemoteTokenFile
    train_y: Shards | Rows | None  # None for lm: targets are the inputs shifted by one
    test_x: np.ndarray  # classify: test features; lm: validation windows (block+1 tokens)
    test_y: np.ndarray | None

    @property
    def prefetches(self) -> bool:
        """The training rows are read from a store that is worth reading ahead (remote_tokens.py)."""
        return hasattr(self.train_x, "prefetch")

    def prefetch(self, batches: list[np.ndarray]) -> None:
        """Start reading these coming batches' rows in the background (where the source can)."""
        if self.prefetches:
            self.train_x.prefetch(batches)  # type: ignore[union-attr]

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "lm":
            w = self.train_x.take(rows).astype(np.int64)
            return w[:, :-1], w[:, 1:]
        assert self.train_y is not None
        return self.train_x.take(rows), self.train_y.take(rows)

    def test_batches(self) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "lm":
            w = self.test_x.astype(np.int64)
            return w[:, :-1], w[:, 1:]
        assert self.test_y is not None
        return self.test_x, self.test_y


# ------------------------------------------------------------------ raw data


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # noqa: PLC0415 - scikit-learn, only for digits
    from sklearn.model_selection import train_test_split  # noqa: PLC0415 - scikit-learn

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(
        x, y.astype(np.int64), test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y
    )
    return xtr, ytr, xte, yte


def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # Gaussian inputs labelled by a fixed random linear teacher: learnable, any size.
    rng = np.random.default_rng([seed, 7])
    teacher = rng.standard_normal((SYNTHETIC_FEATURES, SYNTHETIC_CLASSES)).astype(np.float32)
    n_test = max(n // 5, 1)
    x = rng.standard_normal((n + n_test, SYNTHETIC_FEATURES)).astype(np.float32)
    y = (x @ teacher).argmax(axis=1).astype(np.int64)
    return x[:n], y[:n], x[n:], y[n:]


def corpus_text() -> str:
    """Text shipped with CPython: the pydoc topic help pages (~465k characters)."""
    return "".join(topics[k] for k in sorted(topics))


def vocabulary() -> list[str]:
    return sorted(set(corpus_text()))


# ----------------------------------------------------------------- packing


def _pack_rows(out: Path, stem: str, arr: np.ndarray, shards: int) -> int:
    per = -(-len(arr) // shards)
    for s in range(shards):
        np.save(
            out / f"{stem}-{s:05d}-of-{shards:05d}.npy",
            np.ascontiguousarray(arr[s * per : (s + 1) * per]),
        )
    return per


def _pack_tokens(out: Path, tokens: np.ndarray, shards: int, block: int) -> int:
    windows = len(tokens) - block - 1
    per = -(-windows // shards)
    for s in range(shards):
        np.save(
            out / f"tokens-{s:05d}-of-{shards:05d}.npy", tokens[s * per : (s + 1) * per + block + 1]
        )
    return per


def _build(spec: JobSpec, out: Path) -> dict[str, Any]:
    d, shards, name = spec.data, spec.data.shards, spec.data.builtin
    if name == "pytext":
        text = corpus_text()
        vocab = vocabulary()
        index = {c: i for i, c in enumerate(vocab)}
        tokens = np.fromiter((index[c] for c in text), dtype=np.int16, count=len(text))
        split = int(len(tokens) * (1 - TEXT_VAL_FRACTION))
        block = spec.model.block_size
        train, val = tokens[:split], tokens[split:]
        per = _pack_tokens(out, train, shards, block)
        starts = np.linspace(0, len(val) - block - 2, TEXT_EVAL_WINDOWS).astype(np.int64)
        np.save(out / "test-x.npy", np.stack([val[s : s + block + 1] for s in starts]))
        return {
            "kind": "lm",
            "per": per,
            "num_train": len(train) - block - 1,
            "classes": len(vocab),
            "dim": block,
        }
    xtr, ytr, xte, yte = (
        _digits() if name == "digits" else _synthetic(d.synthetic_samples, d.seed)
    )
    per = _pack_rows(out, "train-x", xtr, shards)
    _pack_rows(out, "train-y", ytr, shards)
    np.save(out / "test-x.npy", xte)
    np.save(out / "test-y.npy", yte)
    classes = 10 if name == "digits" else SYNTHETIC_CLASSES
    return {
        "kind": "classify",
        "per": per,
        "num_train": len(xtr),
        "classes": classes,
        "dim": xtr.shape[1],
    }


def _key(spec: JobSpec) -> str:
    d, name = spec.data, spec.data.builtin
    parts: dict[str, Any] = {"v": FORMAT_VERSION, "name": name, "shards": d.shards}
    if name == "pytext":
        parts["block"] = spec.model.block_size
    if name == "synthetic":
        parts |= {"n": d.synthetic_samples, "seed": d.seed}
    return (
        f"{name}-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    )


def default_cache_dir() -> Path:
    return Path(os.environ.get(C.ENV_DATA_CACHE) or Path(tempfile.gettempdir()) / "disttrain-data")


def load_dataset(spec: JobSpec, cache_dir: Path | None = None) -> Dataset:
    """Pack the dataset into shard files once (atomically: several ranks may race), then map them.
    Your own files (data.path) are mapped where they lie or converted once (file_datasets.py)."""
    root = cache_dir or default_cache_dir()
    if spec.data.builtin is None:
        f = load_file_data(spec, root)
        return Dataset(
            name=f.name, kind=f.kind, num_train=f.num_train, num_classes=f.num_classes, input_dim=f.input_dim,
            train_x=f.train_x, train_y=f.train_y, test_x=f.test_x, test_y=f.test_y,
        )  # fmt: skip
    target = root / _key(spec)

    def pack(tmp: Path) -> None:
        (tmp / "meta.json").write_text(json.dumps(_build(spec, tmp)))

    build_once(target, pack, done="meta.json")
    meta = json.loads((target / "meta.json").read_text())
    shards = spec.data.shards
    test_x = np.load(target / "test-x.npy")
    if meta["kind"] == "lm":
        files = tuple(target / f"tokens-{s:05d}-of-{shards:05d}.npy" for s in range(shards))
        tw = TokenWindows(
            files=files,
            windows_per_shard=meta["per"],
            total_windows=meta["num_train"],
            block_size=meta["dim"],
        )
        return Dataset(
            name=str(spec.data.builtin), kind="lm", num_train=meta["num_train"], num_classes=meta["classes"],
            input_dim=meta["dim"], train_x=tw, train_y=None, test_x=test_x, test_y=None,
        )  # fmt: skip

    def rows(stem: str) -> Shards:
        files = tuple(target / f"{stem}-{s:05d}-of-{shards:05d}.npy" for s in range(shards))
        return Shards(files=files, rows_per_shard=meta["per"], total_rows=meta["num_train"])

    return Dataset(
        name=str(spec.data.builtin), kind="classify", num_train=meta["num_train"], num_classes=meta["classes"],
        input_dim=meta["dim"], train_x=rows("train-x"), train_y=rows("train-y"), test_x=test_x,
        test_y=np.load(target / "test-y.npy"),
    )  # fmt: skip


# ----------------------------------------------------------------- sampler


class GlobalBatchSampler:
    """Deterministic global batches; rank r of `world` gets the r-th contiguous slice of each one.

    State is global (epoch, offset), so it is the same on every rank and survives a
    change of world size. A partial batch at the end of an epoch is dropped so every
    global batch has exactly `batch_size` samples.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        # Both fail the same way on every retry: ConfigError, so the job is not restarted.
        if batch_size % world:
            raise ConfigError(
                f"data.batchSize {batch_size} must be divisible by the data-parallel size {world}"
            )
        if batch_size > num_samples:
            raise ConfigError(
                f"data.batchSize {batch_size} exceeds the {num_samples} training samples"
            )
        self.n, self.batch, self.seed, self.rank, self.world = (
            num_samples,
            batch_size,
            seed,
            rank,
            world,
        )
        self.epoch, self.offset = 0, 0
        self._perm: np.ndarray | None = None

    def _permutation(self) -> np.ndarray:
        if self._perm is None:
            self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        return self._perm

    def next_global(self) -> np.ndarray:
        if self.offset + self.batch > self.n:
            self.epoch, self.offset, self._perm = self.epoch + 1, 0, None
        out = self._permutation()[self.offset : self.offset + self.batch]
        self.offset += self.batch
        return out

    def next_indices(self) -> np.ndarray:
        """This rank's slice of the next global batch."""
        per = self.batch // self.world
        return self.next_global()[self.rank * per : (self.rank + 1) * per]

    def peek_indices(self, ahead: int) -> list[np.ndarray]:
        """What the next `ahead` calls of next_indices will return, without moving the sampler."""
        saved = (self.epoch, self.offset, self._perm)
        try:
            return [self.next_indices() for _ in range(ahead)]
        finally:
            self.epoch, self.offset, self._perm = saved

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "batch_size": self.batch,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset, self._perm = int(state["epoch"]), int(state["offset"]), None
