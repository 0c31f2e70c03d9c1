"""Classification rows of your own data: a feature array and a label array, checked, split into
training and held-out rows, and read through the sampler (arrays.Rows, memory-mapped).

npy is read where it lies; the formats that cannot be memory-mapped as they lie are converted
once, in record batches, into x.npy / y.npy in the data cache (`converted`, convert.py), keyed
by the source's fingerprint and the fields that shape the arrays, and then read like npy.
Every problem (wrong dtype, wrong shape, labels outside the classes) is a ConfigError naming the
file and what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ..process.config import ConfigError
from .arrays import Rows, file_min_max, map_npy, npy_data_offset, read_npy_rows
from .cache import build_once, cached_json, fingerprint, key_name
from .convert import check_batch, write_rows
from .dataset import Dataset
from .permutation import Permutation
from .source import Source

FORMAT_VERSION = 1
SPLIT_SEED = (0, 1)  # the held-out rows must not change with data.seed
MAX_EVAL_ROWS = 10_000  # held-out rows of classification data the evaluation reads
# uint8 features are image pixels (format imagefolder stores them so): scaled to [0, 1] as read.
IMAGE_SCALE = 1 / 255

# (spec.data, the source's local path or None) -> its rows as (features, labels) record batches
Converter = Callable[[DataSpec, Path | None], Iterable[tuple[np.ndarray, np.ndarray]]]


def load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(f"spec.data.path: the {what} file {path} does not exist (or is not a file)")
    try:
        return map_npy(path)
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"spec.data.path: {path} is not a readable .npy file ({e}); is it truncated?") from None


def numeric_labels(spec: JobSpec) -> bool:
    """Whether labels may be numbers, not only class indices (mse, or a loss of your own)."""
    return spec.training.loss != "cross_entropy"


def check_rows(x: np.ndarray, y: np.ndarray, where: str, *, float_labels: bool) -> None:
    """Shapes and dtypes of whole feature and label arrays (memory-mapped: nothing is read)."""
    check_batch(x, y, where, float_labels=float_labels)
    if len(x) < 2:
        raise ConfigError(f"spec.data.path: {where} has {len(x)} samples; training and evaluation need at least 2")


def read_rows(spec: JobSpec, x_path: Path, y_path: Path, cache: Path, where: str) -> Dataset:
    """The Dataset of a feature .npy and a label .npy, checked and split."""
    d = spec.data
    x, y = load_npy(x_path, "feature"), load_npy(y_path, "label")
    check_rows(x, y, where, float_labels=numeric_labels(spec))
    values = spec.training.loss == "mse" or y.dtype.kind == "f"  # a regression: one output, float targets
    classes = 1
    if not values:
        lo, hi = cached_json(cache, {"v": FORMAT_VERSION, "scan": "labels", "file": fingerprint(y_path)},
                             lambda: file_min_max(y_path, str(y.dtype), offset=npy_data_offset(y_path)))  # fmt: skip
        classes = d.classes or hi + 1
        if lo < 0 or hi >= classes:
            field = "spec.data.classes" if d.classes and lo >= 0 else "spec.data.path"
            raise ConfigError(
                f"{field}: labels in {where} span [{lo}, {hi}], outside [0, {classes}): labels are class indices "
                "0 .. classes - 1"
            )
    y_dtype = "float32" if values else "int64"
    n = len(x)
    held = max(1, int(n * d.validation_fraction))
    # The split is a fixed permutation of the rows (not data.seed): its first `held` images are held out.
    order = Permutation(n, SPLIT_SEED)
    test_idx = np.sort(order(np.arange(min(held, MAX_EVAL_ROWS), dtype=np.int64)))
    test_x = read_npy_rows(x_path, test_idx).astype(np.float32)
    test_y = read_npy_rows(y_path, test_idx).astype(y_dtype)
    scale = IMAGE_SCALE if x.dtype == np.uint8 else None
    if scale is not None:
        test_x = test_x * np.float32(scale)
    return Dataset(
        name=where, kind="classify", num_train=n - held, num_classes=classes, targets="values" if values else "classes",
        input_dim=int(np.prod(x.shape[1:])),
        train_x=Rows(path=x_path, order=order, offset=held, dtype="float32", scale=scale),
        train_y=Rows(path=y_path, order=order, offset=held, dtype=y_dtype), test_x=test_x, test_y=test_y,
    )  # fmt: skip


def converted(spec: JobSpec, src: Source, cache: Path, convert: Converter, key: dict[str, Any]) -> Dataset:
    """Data of a format converted once, in record batches (`convert`), into x.npy / y.npy in the
    cache (convert.py); `key`: what else the arrays depend on besides the source and the format."""
    d = spec.data
    full = {"v": FORMAT_VERSION, "format": d.format, "source": fingerprint(src.path) if src.path else [], **key}
    target = cache / key_name(str(d.format), full)

    def build(tmp: Path) -> None:
        write_rows(convert(d, src.path), tmp, src.name, float_labels=numeric_labels(spec))

    build_once(target, build, done="y.npy", what=src.name)
    return read_rows(spec, target / "x.npy", target / "y.npy", cache, src.name)
