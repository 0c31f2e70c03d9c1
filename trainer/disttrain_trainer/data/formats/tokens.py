"""format tokens on a local path: flat binary token ids (nanoGPT's train.bin / val.bin, or one
file), memory-mapped in place; a rank reads only the windows of its rows, never the whole file.

The largest token id is found once per file by a chunked scan (bounded memory on any file size),
cached in the data cache by the file's path, size and mtime; with data.vocabSize given, the ids
are not scanned at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from disttrain_api.model import JobSpec

from ...process.config import ConfigError
from .. import lm
from ..arrays import TokenFile, file_min_max, map_tokens
from ..cache import cached_json, fingerprint
from ..dataset import Dataset
from ..source import Source

FORMAT_VERSION = 1


def token_map(path: Path, dtype: str, what: str) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(f"spec.data.path: {what} {path} does not exist (or is not a file)")
    size, item = path.stat().st_size, np.dtype(dtype).itemsize
    if size == 0 or size % item:
        raise ConfigError(
            f"spec.data.path: {path} holds {size} bytes, not a whole number of {dtype} token ids "
            f"({item} bytes each): the file is truncated or spec.data.tokenDtype is wrong"
        )
    return map_tokens(path, dtype)


def token_data(spec: JobSpec, train_path: Path, val_path: Path | None, dtype: str, cache: Path, *, name: str,
               default_vocab: int, source: str | None = None) -> Dataset:  # fmt: skip
    """A Dataset of the windows of a token file (and its validation file, else its held-out tail)."""
    d, block = spec.data, spec.model.block_size
    train = token_map(train_path, dtype, "the training token file")
    val = token_map(val_path, dtype, "the validation token file") if val_path else None
    files = [p for p in (train_path, val_path) if p is not None]
    vocab = lm.vocabulary(spec, lambda: [
        (source or str(p), hi) for p, (_, hi) in zip(files, cached_json(
            cache, {"v": FORMAT_VERSION, "scan": "tokens", "dtype": dtype, "files": [fingerprint(p) for p in files]},
            lambda: [file_min_max(p, dtype) for p in files]), strict=True)
    ], default=default_vocab)  # fmt: skip
    train_tokens = len(train)
    if val is None:  # nanoGPT's layout without val.bin: hold out the tail
        train_tokens = int(len(train) * (1 - d.validation_fraction))
        val, val_path = train[train_tokens:], train_path
    lm.check_lengths(spec, [("training", train_tokens, source or str(train_path)),
                            ("validation", len(val), source or str(val_path))])  # fmt: skip
    windows = train_tokens - block - 1
    src = TokenFile(path=train_path, dtype=dtype, start=0, windows=windows, block_size=block)
    starts = lm.eval_starts(spec, len(val))
    return lm.dataset(spec, name=name, vocab=vocab, train=src, windows=windows,
                      test_windows=lambda: np.stack([np.asarray(val[s : s + block + 1]) for s in starts]))  # fmt: skip


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    d = spec.data
    assert src.path is not None, "validation requires data.path with format tokens"
    path = src.path
    if path.is_dir():
        train_path, val_path = path / d.train_file, path / d.validation_file
        if not val_path.is_file():
            val_path = None
    else:
        train_path, val_path = path, None
    return token_data(spec, train_path, val_path, d.token_dtype, cache, name=src.name, default_vocab=0)
