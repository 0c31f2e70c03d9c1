"""format csv: a CSV file with a header row, columns as for parquet, converted once into the
cache a block at a time (pyarrow.csv's streaming reader).

As for JSON lines, the reader types a column by its first block: the feature columns are read
as float64 (an integer column whose later rows have decimals still converts), the label column as
float64 with training.loss mse, else as the first block shows (integers for classes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from disttrain_api.model import JobSpec

from ...process.config import ConfigError
from ..dataset import Dataset
from ..source import Source
from . import columns

BLOCK_BYTES = 1 << 20  # bytes of the file parsed at once (the reader holds ~40x that while parsing)


def record_batches(path: Path, names: list[str], check: Callable[[Path, Any], None], *,
                   float_columns: Collection[str] = ()) -> Iterator[tuple[Path, Any]]:  # fmt: skip
    """(path, record batch) of the columns `names`; check(path, the first block's schema) first.
    Number columns in `float_columns` are read as float64 (text stays text: columns.py names it)."""
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for csv data
    import pyarrow.csv as pc  # noqa: PLC0415 - pyarrow

    if not path.is_file():
        raise ConfigError(f"spec.data.path: {path} is not a file; format csv reads one CSV file")
    read = pc.ReadOptions(block_size=BLOCK_BYTES)
    try:
        with pc.open_csv(path, read_options=read) as reader:
            first = reader.schema
        check(path, first)
        numeric = [c for c in names if c in float_columns and
                   (pa.types.is_integer(first.field(c).type) or pa.types.is_floating(first.field(c).type))]  # fmt: skip
        convert = pc.ConvertOptions(include_columns=names, column_types={c: pa.float64() for c in numeric})
        with pc.open_csv(path, read_options=read, convert_options=convert) as reader:
            for batch in reader:
                yield path, batch
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"spec.data.path: {path} is not readable as csv ({e})") from None


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return columns.read_streamed(spec, src, cache, record_batches, "csv")
