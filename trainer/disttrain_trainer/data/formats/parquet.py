"""format parquet: numeric feature columns and an integer label column of a parquet file or a
folder of files (pyarrow), converted once into the cache."""

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
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for parquet data
    import pyarrow.parquet as pq  # noqa: PLC0415 - pyarrow

    assert path is not None, "validation requires data.path with format parquet"
    try:
        names = pq.read_schema(path).names if path.is_file() else pq.ParquetDataset(path).schema.names
        columns.check_names(d, path, names)
        table = pq.read_table(path, columns=columns.wanted(d))
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"spec.data.path: {path} is not readable as parquet ({e})") from None
    return columns.arrays(d, table, path)


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return converted(spec, src, cache, _arrays, columns.key(spec.data))
