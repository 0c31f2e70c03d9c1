"""Language-model data from a stream of token ids, wherever it lies: the vocabulary (the model's,
data.vocabSize, the tokenizer's or the largest id + 1 from a scan) checked against the ids, the
training windows and the held-out validation windows. formats/tokens.py, formats/text.py and
formats/tokens_s3.py build their Dataset here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from disttrain_api.model import JobSpec

from ..process.config import ConfigError
from .dataset import Dataset, RowSource

EVAL_WINDOWS = 128  # validation windows of a token stream, evenly spaced


def model_vocab(spec: JobSpec) -> int | None:
    """An hf: model's vocabulary, which the token ids must fit (None: the data sets the vocabulary)."""
    if spec.model.hf_dir is None:
        return None
    from .. import hf_models  # noqa: PLC0415 - transformers only for hf: models

    vocab = hf_models.vocab_size(spec)
    if spec.data.vocab_size and spec.data.vocab_size != vocab:
        raise ConfigError(f"spec.data.vocabSize: {spec.data.vocab_size} differs from the vocabulary of model "
                          f"{spec.model.name} ({vocab}); leave it 0")  # fmt: skip
    return vocab


@dataclass(frozen=True, kw_only=True)
class Vocabulary:
    size: int
    scanned: bool  # every token id was read and found under `size`; else each batch is checked
    refuse: Callable[[str, int], ConfigError]  # (where, id) -> the error for an id at or past `size`


def vocabulary(spec: JobSpec, scan: Callable[[], list[tuple[str, int]]], *, default: int = 0) -> Vocabulary:
    """The vocabulary: an hf: model's, data.vocabSize, `default` (a tokenizer's), else the largest
    id + 1 from `scan()` (each file's (name, largest id)), which runs only then: with a known
    vocabulary nothing is scanned, and every batch's ids are checked as they are read instead."""
    mv = model_vocab(spec)

    def refuse(where: str, top: int) -> ConfigError:
        if mv:
            return ConfigError(f"spec.data.path: {where} holds token id {top}, outside the vocabulary of model "
                               f"{spec.model.name} ({mv}); tokenize with the model's own tokenizer")  # fmt: skip
        return ConfigError(
            f"spec.data.vocabSize: {where} holds token id {top}, outside the vocabulary of {size}; "
            f"raise vocabSize to at least {top + 1} (or leave it 0 to take the largest id + 1)"
        )

    size = mv or spec.data.vocab_size or default
    if size:
        return Vocabulary(size=size, scanned=False, refuse=refuse)
    _, top = max(scan(), key=lambda t: t[1])
    size = top + 1
    return Vocabulary(size=size, scanned=True, refuse=refuse)


def check_lengths(spec: JobSpec, splits: list[tuple[str, int, str]]) -> None:
    """Each split ((what, tokens, name)) holds at least one window."""
    block = spec.model.block_size
    for what, n, name in splits:
        if n < block + 2:
            raise ConfigError(
                f"spec.data.path: {name} has {n} {what} tokens, fewer than one window of model.blockSize "
                f"{block} + 2; give more tokens or a smaller blockSize"
            )


def eval_starts(spec: JobSpec, val_tokens: int) -> np.ndarray:
    """The first token of each held-out validation window, evenly spaced."""
    return np.linspace(0, val_tokens - spec.model.block_size - 2, EVAL_WINDOWS).astype(np.int64)


def dataset(spec: JobSpec, *, name: str, vocab: Vocabulary, train: RowSource, windows: int,
            test_windows: Callable[[], np.ndarray]) -> Dataset:  # fmt: skip
    test_x = test_windows().astype(np.int64)
    top = int(test_x.max())
    if top >= vocab.size:  # the held-out windows are read now: their ids are checked now
        raise vocab.refuse(f"{name} (its validation windows)", top)
    unchecked = None if vocab.scanned else (lambda top: vocab.refuse(name, top))
    return Dataset(name=name, kind="lm", num_train=windows, num_classes=vocab.size, input_dim=spec.model.block_size,
                   train_x=train, train_y=None, test_x=test_x, test_y=None, id_error=unchecked)  # fmt: skip
