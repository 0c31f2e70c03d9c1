"""Formats that cannot be memory-mapped as they lie (npz, parquet, jsonl, a module's Dataset),
read once into a feature array and a label array. file_datasets.py writes them into the shard
cache and checks them like any .npy pair.

parquet and jsonl are read with pyarrow (jsonl: pyarrow.json), only the named columns.
"""

from __future__ import annotations

import importlib
import inspect
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec

from .process.config import ConfigError


def module_fingerprint(factory: str) -> list[Any]:
    """The factory's source file, path size and mtime: an edited module converts its data again."""
    if not factory:
        return []
    try:
        module = importlib.import_module(factory.split(":", 1)[0])
        src = Path(inspect.getfile(module))
    except (ImportError, TypeError, OSError):
        return [factory]  # import errors are reported by read_rows with the fix
    st = src.stat()
    return [str(src), st.st_size, st.st_mtime_ns]


def _npz(d: DataSpec, path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.keys())
            missing = [k for k in (d.features, d.labels) if k not in keys]
            if missing:
                field = "spec.data.features" if d.features in missing else "spec.data.labels"
                raise ConfigError(f"{field}: {path} has no array {missing[0]!r} (it holds {', '.join(keys) or 'none'})")
            return z[d.features], z[d.labels]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"spec.data.path: {path} is not a readable .npz archive ({e}); is it truncated?") from None


def _table(d: DataSpec, path: Path) -> Any:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for parquet and jsonl data

    columns = list(dict.fromkeys([*d.feature_columns, d.label_column]))
    try:
        if d.format == "parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415 - pyarrow

            names = pq.read_schema(path).names if path.is_file() else pq.ParquetDataset(path).schema.names
            _check_columns(d, path, names)
            return pq.read_table(path, columns=columns)
        import pyarrow.json as pj  # noqa: PLC0415 - pyarrow

        table = pj.read_json(path)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"spec.data.path: {path} is not readable as {d.format} ({e})") from None
    _check_columns(d, path, table.column_names)
    return table.select(columns)


def _check_columns(d: DataSpec, path: Path, names: list[str]) -> None:
    for field, col in [*(("spec.data.featureColumns", c) for c in d.feature_columns),
                       ("spec.data.labelColumn", d.label_column)]:  # fmt: skip
        if col not in names:
            raise ConfigError(f"{field}: {path} has no column {col!r} (it has {', '.join(names) or 'none'})")


def _column(table: Any, name: str, field: str, path: Path) -> np.ndarray:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow

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


def _columns(d: DataSpec, path: Path) -> tuple[np.ndarray, np.ndarray]:
    table = _table(d, path)
    parts = [_column(table, c, "spec.data.featureColumns", path) for c in d.feature_columns]
    x = np.concatenate([p.reshape(len(p), -1).astype(np.float32) for p in parts], axis=1)
    return x, _column(table, d.label_column, "spec.data.labelColumn", path)


def _module(d: DataSpec, path: Path | None) -> tuple[np.ndarray, np.ndarray]:
    assert d.factory, "validation requires data.factory with format module"
    module, attr = d.factory.split(":", 1)
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"spec.data.factory {d.factory!r}: cannot import ({e}); is the module installed in the "
                          "image?") from None
    dataset = factory(str(path) if path is not None else "")
    try:
        n = len(dataset)
    except TypeError:
        raise ConfigError(f"spec.data.factory {d.factory!r} returned {type(dataset).__name__}, not a map-style "
                          "Dataset (it needs __len__ and __getitem__)") from None
    xs, ys = [], []
    for i in range(n):
        item = dataset[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError(f"spec.data.factory {d.factory!r}: item {i} is {type(item).__name__}, not a "
                              "(features, label) pair")
        xs.append(np.asarray(item[0]))
        ys.append(np.asarray(item[1]))
    if not xs:
        raise ConfigError(f"spec.data.factory {d.factory!r} returned an empty Dataset")
    try:
        return np.stack(xs), np.stack(ys).reshape(n)
    except ValueError as e:
        raise ConfigError(f"spec.data.factory {d.factory!r}: items of different shapes ({e})") from None


def read_rows(d: DataSpec, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of npz, parquet, jsonl or module data."""
    if d.format == "npz":
        return _npz(d, path)
    if d.format in ("parquet", "jsonl"):
        return _columns(d, path)
    return _module(d, path if d.path else None)
