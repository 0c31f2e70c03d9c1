"""A residual MLP classifier that disttrain can train in data (DDP or FSDP) and pipeline modes.

disttrain calls `factory(spec, dataset)` once per process, with the same seed on every rank, and
wraps or splits the module it returns itself:
  - data (DDP, FSDP): any nn.Module whose forward maps a batch of inputs to logits;
  - pipeline: `pipeline_blocks()` returns the ordered blocks, each one tensor in, one tensor out,
    that applied in turn equal forward (the blocks share the model's parameters).
"""

from __future__ import annotations

from typing import Any

from disttrain_trainer.models import ConfigError
from torch import Tensor, nn


class Residual(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class ResidualMLP(nn.Module):
    def __init__(self, *, inputs: int, width: int, depth: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(1), nn.Linear(inputs, width))
        self.blocks = nn.Sequential(*(Residual(width, dropout) for _ in range(depth)))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))

    def pipeline_blocks(self) -> list[nn.Module]:
        return [self.stem, *self.blocks, self.head]


def factory(spec: Any, dataset: Any) -> nn.Module:
    """`spec`: the job's parsed spec (spec.model.hidden, .layers, .dropout, ...); `dataset`: the
    trainer's dataset (kind, input_dim, num_classes). Raise ConfigError for a spec that cannot fit:
    the job then fails at once (exit 2) instead of restarting."""
    if dataset.kind != "classify":
        raise ConfigError(f"model.name {spec.model.name} classifies; data {dataset.name} is not a classification set")
    m = spec.model
    return ResidualMLP(inputs=dataset.input_dim, width=m.hidden, depth=m.layers, classes=dataset.num_classes,
                       dropout=m.dropout)  # fmt: skip
