"""A small next-token model for token data (`data.format: tokens`, or the built-in pytext).

disttrain calls `factory(spec, dataset)` as for the classifier in model.py. For a language-model
dataset (kind "lm") a batch is (batch, blockSize) token ids, and the model returns logits of
shape (batch, blockSize, vocabulary): one next-token prediction per position. Each layer mixes a
position with the one before it (causal), so the model is a learned n-gram rather than a
transformer: enough to learn something in a few steps, small enough to train on CPUs.
"""

from __future__ import annotations

from typing import Any

import torch
from disttrain_trainer.models import ConfigError
from torch import Tensor, nn

from .model import Residual


class ShiftMix(nn.Module):
    """Adds to every position a projection of it and of the position before it (position 0
    sees zeros there), then a residual MLP."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mix = nn.Linear(2 * width, width)
        self.mlp = Residual(width, dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        before = nn.functional.pad(h, (0, 0, 1, 0))[:, :-1]
        return self.mlp(x + self.mix(torch.cat([h, before], dim=-1)))


class TokenModel(nn.Module):
    def __init__(self, *, vocab: int, width: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(ShiftMix(width, dropout) for _ in range(depth)))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab))

    def forward(self, idx: Tensor) -> Tensor:
        return self.head(self.blocks(self.embed(idx)))

    def pipeline_blocks(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, self.head]


def factory(spec: Any, dataset: Any) -> nn.Module:
    """`dataset.num_classes` is the vocabulary (data.vocabSize, or the largest id + 1)."""
    if dataset.kind != "lm":
        raise ConfigError(f"model.name {spec.model.name} predicts tokens; data {dataset.name} is not token data")
    m = spec.model
    return TokenModel(vocab=dataset.num_classes, width=m.hidden, depth=m.layers, dropout=m.dropout)
