"""Language-model data from a stream of token ids, wherever it lies: the vocabulary (the model's,
data.vocabSize, the tokenizer's or the largest id + 1) checked against the ids, the training
windows and the held-out validation windows. formats/tokens.py, formats/text.py and
formats/tokens_s3.py build their Dataset here."""

from __future__ import annotations

from collections.abc import Callable

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


def vocabulary(spec: JobSpec, tops: list[tuple[str, int]], *, default: int = 0) -> int:
    """The vocabulary, given each file's largest token id (`tops`: (name, id)); a token id at or
    past it is refused, naming the file."""
    top_name, top = max(tops, key=lambda t: t[1])
    mv = model_vocab(spec)
    vocab = mv or spec.data.vocab_size or default or top + 1
    if top >= vocab:
        if mv:
            raise ConfigError(f"spec.data.path: {top_name} holds token id {top}, outside the vocabulary of model "
                              f"{spec.model.name} ({vocab}); tokenize with the model's own tokenizer")  # fmt: skip
        raise ConfigError(
            f"spec.data.vocabSize: {top_name} holds token id {top}, outside the vocabulary of {vocab}; "
            f"raise vocabSize to at least {top + 1} (or leave it 0 to take the largest id + 1)"
        )
    return vocab


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


def dataset(spec: JobSpec, *, name: str, vocab: int, train: RowSource, windows: int,
            test_windows: Callable[[], np.ndarray]) -> Dataset:  # fmt: skip
    return Dataset(name=name, kind="lm", num_train=windows, num_classes=vocab, input_dim=spec.model.block_size,
                   train_x=train, train_y=None, test_x=test_windows().astype(np.int64), test_y=None)  # fmt: skip
