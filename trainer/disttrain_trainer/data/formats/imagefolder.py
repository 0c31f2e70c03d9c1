"""format imagefolder: one subfolder of images per class (the layout torchvision's ImageFolder
reads): class i is the i-th subfolder by name. Every image is decoded once with Pillow, converted
to RGB, resized to data.imageSize x imageSize and stored as uint8 (3, side, side) rows in the
cache, a batch of images at a time; rows.py scales them to [0, 1] as batches are read. A file
Pillow cannot read stops the job with exit 2 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..dataset import Dataset
from ..rows import converted
from ..source import Source

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
BATCH_IMAGES = 256  # images decoded before they are appended (256 x 3 x 224 x 224 bytes: 38 MB)


def listing(path: Path) -> list[tuple[Path, int]]:
    """(image file, class index) of every image, classes by subfolder name, files by name."""
    if not path.is_dir():
        raise ConfigError(f"spec.data.path: {path} is not a directory; format imagefolder reads one subfolder "
                          "of images per class")  # fmt: skip
    classes = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ConfigError(f"spec.data.path: {path} has {len(classes)} class subfolders; format imagefolder needs "
                          "one subfolder of images per class, at least 2")  # fmt: skip
    out = []
    for label, folder in enumerate(classes):
        images = sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise ConfigError(f"spec.data.path: the class folder {folder} holds no images "
                              f"({', '.join(IMAGE_SUFFIXES)})")  # fmt: skip
        out += [(f, label) for f in images]
    return out


def _decode(f: Path, side: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 - Pillow, only for format imagefolder

    try:
        with Image.open(f) as im:
            rgb = im.convert("RGB").resize((side, side), Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ConfigError(f"spec.data.path: {f} is not an image Pillow can read ({e})") from None


def _batches(d: DataSpec, path: Path | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    assert path is not None, "validation requires data.path with format imagefolder"
    files = listing(path)
    for i in range(0, len(files), BATCH_IMAGES):
        part = files[i : i + BATCH_IMAGES]
        yield np.stack([_decode(f, d.image_size) for f, _ in part]), np.array([c for _, c in part], dtype=np.int64)


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    return converted(spec, src, cache, _batches, {"imageSize": spec.data.image_size})
