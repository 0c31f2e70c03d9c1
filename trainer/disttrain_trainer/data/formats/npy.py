"""format npy: a folder with <features>.npy and <labels>.npy, memory-mapped in place."""

from __future__ import annotations

from pathlib import Path

from disttrain_api.model import JobSpec

from ...process.config import ConfigError
from ..dataset import Dataset
from ..rows import read_rows
from ..source import Source


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    d = spec.data
    assert src.path is not None, "validation requires data.path with format npy"
    if not src.path.is_dir():
        raise ConfigError(f"spec.data.path: {src.path} is not a directory; format npy reads "
                          f"{d.features}.npy and {d.labels}.npy inside one")  # fmt: skip
    name = lambda stem: stem if stem.endswith(".npy") else f"{stem}.npy"  # noqa: E731
    return read_rows(spec, src.path / name(d.features), src.path / name(d.labels), cache, src.name)
