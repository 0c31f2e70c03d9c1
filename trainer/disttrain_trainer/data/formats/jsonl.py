"""format jsonl: one JSON-lines file, columns as for parquet (pyarrow.json), converted once into
the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..dataset import Dataset
from ..rows import converted
from ..source import Source
from . import columns


def _arrays(d: DataSpec, path: Path | None) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for jsonl data
    import pyarrow.json as pj  # noqa: PLC0415 - pyarrow

    assert path is not None, "validation requires data.path with format jsonl"
    try:
        table = pj.read_json(path)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"spec.data.path: {path} is not readable as jsonl ({e})") from None
    columns.check_names(d, path, table.column_names)
    return columns.arrays(d, table.select(columns.wanted(d)), path)


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return converted(spec, src, cache, _arrays, columns.key(spec.data))
