"""format hfdataset: a folder written by a Hugging Face `datasets.Dataset.save_to_disk`, read
offline with the `datasets` library (its Arrow files are memory-mapped), columns as for parquet,
converted once into the cache a record batch at a time. A DatasetDict (several splits) is
refused with the fix: name one split's folder."""

from __future__ import annotations

import os
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


def _load(path: Path) -> Any:
    """The Dataset saved in `path`, loaded offline (nothing is downloaded)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # read by datasets at import
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets  # noqa: PLC0415 - datasets, only for format hfdataset

    datasets.disable_progress_bars()
    if not path.is_dir():
        raise ConfigError(f"spec.data.path: {path} is not a directory; format hfdataset reads a folder written by "
                          "Dataset.save_to_disk")  # fmt: skip
    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"spec.data.path: {path} is not a dataset saved with save_to_disk ({first})") from None
    if isinstance(ds, datasets.DatasetDict):
        raise ConfigError(f"spec.data.path: {path} holds the splits {', '.join(ds)} (a DatasetDict); give the "
                          f"folder of one, e.g. {path / next(iter(ds))}")  # fmt: skip
    return ds


def record_batches(path: Path, names: list[str], check: Callable[[Path, Any], None]) -> Iterator[tuple[Path, Any]]:
    """(path, record batch) of the columns `names`; check(path, the arrow schema) first."""
    ds = _load(path)
    check(path, ds.data.schema)
    for table in ds.select_columns(names).with_format("arrow").iter(batch_size=BATCH_ROWS):
        for batch in table.to_batches():
            yield path, batch


def _batches(d: DataSpec, path: Path | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    assert path is not None, "validation requires data.path with format hfdataset"
    check = lambda f, schema: columns.check_names(d, f, schema.names)  # noqa: E731
    for f, batch in record_batches(path, columns.wanted(d), check):
        yield columns.arrays(d, batch, f)


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return converted(spec, src, cache, _batches, columns.key(spec.data))
