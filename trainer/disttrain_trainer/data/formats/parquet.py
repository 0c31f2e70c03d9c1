"""format parquet: numeric feature columns and an integer label column of a parquet file or a
folder of files (pyarrow), converted once into the cache a record batch at a time (one row
group's pages of the named columns in memory at once, never the whole file)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..convert import BATCH_ROWS
from ..dataset import Dataset
from ..rows import converted
from ..source import Source
from . import columns


def files(path: Path) -> list[Path]:
    """The parquet files of `path` (a file, or every *.parquet under a folder, in name order)."""
    if path.is_file():
        return [path]
    found = sorted(p for p in path.rglob("*.parquet") if p.is_file())
    if not found:
        raise ConfigError(f"spec.data.path: the folder {path} holds no .parquet files")
    return found


def record_batches(path: Path, names: list[str], check: Callable[[Path, Any], None]) -> Iterator[tuple[Path, Any]]:
    """(file, record batch) of the columns `names`, file by file; check(file, its arrow schema) first."""
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for parquet data
    import pyarrow.parquet as pq  # noqa: PLC0415 - pyarrow

    for f in files(path):
        try:
            # pre_buffer off: pyarrow would otherwise read every row group's pages at the start
            # (measured: a 264 MB file held whole); so one row group's columns at a time.
            pf = pq.ParquetFile(f, pre_buffer=False)
            check(f, pf.schema_arrow)
            for group in range(pf.num_row_groups):
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=names, row_groups=[group]):
                    yield f, batch
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"spec.data.path: {f} is not readable as parquet ({e})") from None


def _batches(d: DataSpec, path: Path | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    assert path is not None, "validation requires data.path with format parquet"
    check = lambda f, schema: columns.check_names(d, f, schema.names)  # noqa: E731
    for f, batch in record_batches(path, columns.wanted(d), check):
        yield columns.arrays(d, batch, f)


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return converted(spec, src, cache, _batches, columns.key(spec.data))
