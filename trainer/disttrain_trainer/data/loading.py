"""load_dataset(spec): the one way into the data, for every mode.

A built-in dataset (data.name) is packed once into shards (builtin.py). Your own data goes down
one path: where it lies (source.py: a local path, or an s3:// URI) and its format pick a reader
from the table below, which returns the Dataset. Token files on object storage are read in place
(formats/tokens_s3.py); every other format there is staged once into the data cache
(object_store.stage) and read by the local reader. A text column (data.textColumn) is read by the
text reader whatever the file's format (formats/text.py tokenizes it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from disttrain_api.model import JobSpec

from . import builtin, object_store, source
from .cache import default_cache_dir
from .dataset import Dataset

# (spec, where the data is, the data cache) -> the Dataset
Reader = Callable[[JobSpec, source.Source, Path], Dataset]

# (what is read, where it lies) -> its reader, "module:function" under this package. A format
# with no reader of its own for a remote source is staged into the cache and read as local.
READERS = {
    ("tokens", "local"): "formats.tokens:read",
    ("tokens", "s3"): "formats.tokens_s3:read",
    ("text", "local"): "formats.text:read",
    ("npy", "local"): "formats.npy:read",
    ("npz", "local"): "formats.npz:read",
    ("parquet", "local"): "formats.parquet:read",
    ("jsonl", "local"): "formats.jsonl:read",
    ("csv", "local"): "formats.csv:read",
    ("hfdataset", "local"): "formats.hfdataset:read",
    ("imagefolder", "local"): "formats.imagefolder:read",
    ("module", "local"): "formats.module:read",
}


def _what(spec: JobSpec) -> str:
    """What the reader reads: the format, or "text" for a tokenized text column."""
    return "text" if spec.data.text_column is not None else str(spec.data.format)


def reader_for(what: str, where: str) -> Reader:
    """The reader of `what` at a source of kind `where`, its module imported now."""
    module, func = READERS[(what, where)].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), func)


def load_dataset(spec: JobSpec, cache_dir: Path | None = None) -> Dataset:
    """The training and held-out data of `spec`, checked: a ConfigError names what is wrong."""
    return replace(_read(spec, cache_dir or default_cache_dir(spec.checkpoint.path)), loss=spec.training.loss)


def _read(spec: JobSpec, cache: Path) -> Dataset:
    d = spec.data
    if d.builtin is not None:
        return builtin.load(spec, cache)
    what, where = _what(spec), source.kind(d)
    if where == "local":
        return reader_for(what, where)(spec, source.local(d), cache)
    if (what, where) in READERS:
        return reader_for(what, where)(spec, source.Source(path=None, name=str(d.path), uri=str(d.path)), cache)
    staged = object_store.stage(spec, cache)
    return reader_for(what, "local")(spec, source.Source(path=staged, name=str(d.path)), cache)
