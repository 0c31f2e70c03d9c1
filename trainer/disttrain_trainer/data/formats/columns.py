"""Named columns of pyarrow record batches as feature and label arrays: what parquet, jsonl, csv
and hfdataset share. Scalar columns become one feature each; a list column (a vector per row,
e.g. an image) as many as its rows are long, the same in every row."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..dataset import Dataset
from ..rows import converted
from ..source import Source

# A streaming reader (csv.py, jsonl.py): (path, record batch) of the columns `names`, having
# called check(path, the first block's schema); number columns in `float_columns` as float64.
RecordBatches = Callable[..., Iterator[tuple[Path, Any]]]


def wanted(d: DataSpec) -> list[str]:
    """The columns read: the feature columns, then the label column."""
    return list(dict.fromkeys([*d.feature_columns, d.label_column]))


def check_names(d: DataSpec, path: Path | str, names: list[str]) -> None:
    for field, col in [*(("spec.data.featureColumns", c) for c in d.feature_columns),
                       ("spec.data.labelColumn", d.label_column)]:  # fmt: skip
        if col not in names:
            raise ConfigError(f"{field}: {path} has no column {col!r} (it has {', '.join(names) or 'none'})")


def _column(batch: Any, name: str, field: str, path: Path | str) -> np.ndarray:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for columnar data

    col = batch.column(name)
    t = col.type
    if col.null_count:
        raise ConfigError(f"{field}: column {name!r} of {path} has empty values")
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return col.to_numpy(zero_copy_only=False)
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        values = col.flatten()
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)) or values.null_count:
            raise ConfigError(f"{field}: column {name!r} of {path} holds lists of {values.type}, not numbers")
        lengths = np.unique(col.value_lengths().to_numpy(zero_copy_only=False)) if len(col) else np.array([0])
        if len(lengths) > 1:
            raise ConfigError(f"{field}: column {name!r} of {path} holds lists of different lengths "
                              f"({', '.join(str(n) for n in lengths[:5])}); every row needs the same")  # fmt: skip
        return values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(col), int(lengths[0]))
    raise ConfigError(f"{field}: column {name!r} of {path} is {t}, not numbers")


def arrays(d: DataSpec, batch: Any, path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of a record batch (or table) holding the wanted columns."""
    parts = [_column(batch, c, "spec.data.featureColumns", path) for c in d.feature_columns]
    x = np.concatenate([p.reshape(len(p), -1).astype(np.float32) for p in parts], axis=1)
    return x, _column(batch, d.label_column, "spec.data.labelColumn", path)


def key(d: DataSpec) -> dict[str, Any]:
    """What the converted arrays depend on besides the source."""
    return {"columns": list(d.feature_columns), "label": d.label_column}


def read_streamed(spec: JobSpec, src: Source, cache: Path, record_batches: RecordBatches, fmt: str) -> Dataset:
    """A row file that `record_batches` reads a block at a time, converted once into the cache:
    the feature columns (and the label column with training.loss mse) read as float64, since the
    reader types a column by its first block and a later 1.5 in an integer column would fail."""
    floats: Collection[str] = {*spec.data.feature_columns,
                               *([spec.data.label_column] if spec.training.loss == "mse" else [])}  # fmt: skip

    def batches(d: DataSpec, path: Path | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        assert path is not None, f"validation requires data.path with format {fmt}"
        check = lambda f, schema: check_names(d, f, schema.names)  # noqa: E731
        for f, batch in record_batches(path, wanted(d), check, float_columns=floats):
            yield arrays(d, batch, f)

    return converted(spec, src, cache, batches, {**key(spec.data), "loss": spec.training.loss == "mse"})
