"""format jsonl: one JSON-lines file, columns as for parquet, converted once into the cache a
block at a time (pyarrow.json's streaming reader).

The reader takes its column types from the first block; a number column whose first block holds
only integers would refuse a later 1.5, so the feature columns are read as float64 (lists of
them too), the label column too with training.loss mse, else it keeps the type the first block
shows (integers for classes).
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
    Integer columns in `float_columns` (and lists of integers) are read as float64."""
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for jsonl data
    import pyarrow.json as pj  # noqa: PLC0415 - pyarrow

    read = pj.ReadOptions(block_size=BLOCK_BYTES)
    try:
        with pj.open_json(path, read_options=read) as reader:
            first = reader.schema
        check(path, first)
        fields = []
        for name in names:
            t = first.field(name).type
            if name in float_columns and pa.types.is_integer(t):
                t = pa.float64()
            elif name in float_columns and pa.types.is_list(t) and pa.types.is_integer(t.value_type):
                t = pa.list_(pa.float64())
            fields.append(pa.field(name, t))
        parse = pj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
        with pj.open_json(path, read_options=read, parse_options=parse) as reader:
            for batch in reader:
                yield path, batch
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"spec.data.path: {path} is not readable as jsonl ({e})") from None


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return columns.read_streamed(spec, src, cache, record_batches, "jsonl")
