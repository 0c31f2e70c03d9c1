"""format module: data.factory ('package.module:factory') returns a map-style torch Dataset of
(features, label) items, read once into the cache, BATCH_ROWS items at a time. An edited module converts again: its source
file's path, size and mtime are part of the cache key."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..convert import BATCH_ROWS
from ..dataset import Dataset
from ..rows import converted
from ..source import Source


def module_fingerprint(factory: str) -> list[Any]:
    """The factory's source file, path size and mtime: an edited module converts its data again."""
    if not factory:
        return []
    try:
        module = importlib.import_module(factory.split(":", 1)[0])
        src = Path(inspect.getfile(module))
    except (ImportError, TypeError, OSError):
        return [factory]  # import errors are reported by _batches with the fix
    st = src.stat()
    return [str(src), st.st_size, st.st_mtime_ns]


def _batches(d: DataSpec, path: Path | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
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
    if n == 0:
        raise ConfigError(f"spec.data.factory {d.factory!r} returned an empty Dataset")
    for start in range(0, n, BATCH_ROWS):  # BATCH_ROWS items in memory at once
        xs, ys = [], []
        for i in range(start, min(n, start + BATCH_ROWS)):
            item = dataset[i]
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ConfigError(f"spec.data.factory {d.factory!r}: item {i} is {type(item).__name__}, not a "
                                  "(features, label) pair")
            xs.append(np.asarray(item[0]))
            ys.append(np.asarray(item[1]))
        try:
            yield np.stack(xs), np.stack(ys).reshape(len(ys))
        except ValueError as e:
            raise ConfigError(f"spec.data.factory {d.factory!r}: items of different shapes ({e})") from None


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    d = spec.data
    return converted(spec, src, cache, _batches, {"factory": d.factory, "module": module_fingerprint(d.factory or "")})
