"""format npz: the arrays `features` and `labels` of one archive, converted once into the cache."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..dataset import Dataset
from ..rows import converted
from ..source import Source


def _arrays(d: DataSpec, path: Path | None) -> tuple[np.ndarray, np.ndarray]:
    assert path is not None, "validation requires data.path with format npz"
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


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    d = spec.data
    return converted(spec, src, cache, _arrays, {"features": d.features, "labels": d.labels})
