"""Named columns of a pyarrow table as feature and label arrays: what parquet and jsonl share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec

from ...process.config import ConfigError


def wanted(d: DataSpec) -> list[str]:
    """The columns read: the feature columns, then the label column."""
    return list(dict.fromkeys([*d.feature_columns, d.label_column]))


def check_names(d: DataSpec, path: Path, names: list[str]) -> None:
    for field, col in [*(("spec.data.featureColumns", c) for c in d.feature_columns),
                       ("spec.data.labelColumn", d.label_column)]:  # fmt: skip
        if col not in names:
            raise ConfigError(f"{field}: {path} has no column {col!r} (it has {', '.join(names) or 'none'})")


def _column(table: Any, name: str, field: str, path: Path) -> np.ndarray:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for parquet and jsonl data

    col = table.column(name)
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        if col.null_count:
            raise ConfigError(f"{field}: column {name!r} of {path} has {col.null_count} empty values")
        return col.to_numpy()
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        try:  # a vector per row (e.g. an image): rows of one length
            return np.stack([np.asarray(v, dtype=np.float32) for v in col.to_pylist()])
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{field}: column {name!r} of {path} holds lists of different lengths ({e})") from None
    raise ConfigError(f"{field}: column {name!r} of {path} is {t}, not numbers")


def arrays(d: DataSpec, table: Any, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of a table holding the wanted columns."""
    parts = [_column(table, c, "spec.data.featureColumns", path) for c in d.feature_columns]
    x = np.concatenate([p.reshape(len(p), -1).astype(np.float32) for p in parts], axis=1)
    return x, _column(table, d.label_column, "spec.data.labelColumn", path)


def key(d: DataSpec) -> dict[str, Any]:
    """What the converted arrays depend on besides the source."""
    return {"columns": list(d.feature_columns), "label": d.label_column}
