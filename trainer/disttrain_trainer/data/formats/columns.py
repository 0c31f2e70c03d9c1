"""Named columns of pyarrow record batches as feature and label arrays: what parquet, jsonl, csv
and hfdataset share. Scalar columns become one feature each; a list column (a vector per row,
e.g. an image) as many as its rows are long, the same in every row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec

from ...process.config import ConfigError


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
