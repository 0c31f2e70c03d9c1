"""The built-in datasets (data.name): digits (scikit-learn), pytext (text shipped with CPython) and
synthetic, packed once into a few .npy shard files in the data cache and memory-mapped by every
rank (arrays.Shards, arrays.TokenWindows)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
from disttrain_api.model import JobSpec

from .arrays import Shards, TokenWindows
from .cache import build_once
from .dataset import Dataset

FORMAT_VERSION = 1
TEST_FRACTION = 0.2
SPLIT_SEED = 0  # fixed: the test set must not change with data.seed
TEXT_VAL_FRACTION = 0.1
TEXT_EVAL_WINDOWS = 128
SYNTHETIC_FEATURES = 64
SYNTHETIC_CLASSES = 10


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


def load(spec: JobSpec, root: Path) -> Dataset:
    """Pack the built-in dataset into shard files once (atomically: several ranks may race), then map them."""
    target = root / _key(spec)

    def pack(tmp: Path) -> None:
        (tmp / "meta.json").write_text(json.dumps(_build(spec, tmp)))

    build_once(target, pack, done="meta.json", what=f"the built-in dataset {spec.data.builtin}")
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
