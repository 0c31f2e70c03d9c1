"""Classification rows of your own data: a feature array and a label array, checked, split into
training and held-out rows, and read through the sampler (arrays.Rows, memory-mapped).

npy is read where it lies; the formats that cannot be memory-mapped as they lie (npz, parquet,
jsonl, a module's Dataset) are converted once into x.npy / y.npy in the data cache (`converted`),
keyed by the source's fingerprint and the fields that shape the arrays, and then read like npy.
Every problem (wrong dtype, wrong shape, labels outside the classes) is a ConfigError naming the
file and what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ..process.config import ConfigError
from .arrays import Rows, min_max
from .cache import build_once, cached_json, fingerprint, key_name
from .dataset import Dataset
from .permutation import Permutation
from .source import Source

FORMAT_VERSION = 1
SPLIT_SEED = (0, 1)  # the held-out rows must not change with data.seed
MAX_EVAL_ROWS = 10_000  # held-out rows of classification data the evaluation reads

# (spec.data, the source's local path or None) -> (features, labels)
Converter = Callable[[DataSpec, Path | None], tuple[np.ndarray, np.ndarray]]


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


def read_rows(spec: JobSpec, x_path: Path, y_path: Path, cache: Path, where: str) -> Dataset:
    """The Dataset of a feature .npy and a label .npy, checked and split."""
    d = spec.data
    x, y = load_npy(x_path, "feature"), load_npy(y_path, "label")
    check_rows(x, y, where)
    lo, hi = cached_json(cache, {"v": FORMAT_VERSION, "scan": "labels", "file": fingerprint(y_path)},
                         lambda: min_max(y))  # fmt: skip
    classes = d.classes or hi + 1
    if lo < 0 or hi >= classes:
        field = "spec.data.classes" if d.classes and lo >= 0 else "spec.data.path"
        raise ConfigError(
            f"{field}: labels in {where} span [{lo}, {hi}], outside [0, {classes}): labels are class indices "
            "0 .. classes - 1"
        )
    n = len(x)
    held = max(1, int(n * d.validation_fraction))
    # The split is a fixed permutation of the rows (not data.seed): its first `held` images are held out.
    order = Permutation(n, SPLIT_SEED)
    test_idx = np.sort(order(np.arange(min(held, MAX_EVAL_ROWS), dtype=np.int64)))
    test_x = np.asarray(x[test_idx], dtype=np.float32)
    test_y = np.asarray(y[test_idx], dtype=np.int64)
    return Dataset(
        name=where, kind="classify", num_train=n - held, num_classes=classes,
        input_dim=int(np.prod(x.shape[1:])), train_x=Rows(path=x_path, order=order, offset=held, dtype="float32"),
        train_y=Rows(path=y_path, order=order, offset=held, dtype="int64"), test_x=test_x, test_y=test_y,
    )  # fmt: skip


def converted(spec: JobSpec, src: Source, cache: Path, convert: Converter, key: dict[str, Any]) -> Dataset:
    """Data of a format read whole (`convert`), converted once into x.npy / y.npy in the cache;
    `key`: what else the arrays depend on besides the source and the format."""
    d = spec.data
    full = {"v": FORMAT_VERSION, "format": d.format, "source": fingerprint(src.path) if src.path else [], **key}
    target = cache / key_name(str(d.format), full)

    def build(tmp: Path) -> None:
        x, y = convert(d, src.path)
        check_rows(x, y, src.name)
        np.save(tmp / "x.npy", np.ascontiguousarray(x))
        np.save(tmp / "y.npy", np.ascontiguousarray(y))

    build_once(target, build, done="y.npy")
    return read_rows(spec, target / "x.npy", target / "y.npy", cache, src.name)
