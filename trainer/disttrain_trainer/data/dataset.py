"""What a rank trains on: a Dataset of row sources (arrays.py, formats/tokens_s3.py) read one
global batch's slice at a time, and the held-out rows for evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from .sampler import GlobalBatchSampler

# Batches named ahead of the loop, for a source that reads them in the background.
PREFETCH_BATCHES = 4


class RowSource(Protocol):
    """Rows of one logical array: `take(rows)` reads them, in the order given."""

    def take(self, rows: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True)
class Dataset:
    name: str
    kind: Literal["classify", "lm"]
    num_train: int
    num_classes: int  # classes, or vocabulary size for "lm"
    input_dim: int  # features per sample (classify) or block size (lm)
    train_x: RowSource
    train_y: RowSource | None  # None for lm: targets are the inputs shifted by one
    test_x: np.ndarray  # classify: test features; lm: validation windows (block+1 tokens)
    test_y: np.ndarray | None
    # classify: integer class labels, or numbers (a regression: training.loss mse or a loss of your own)
    targets: Literal["classes", "values"] = "classes"
    loss: str = "cross_entropy"  # spec.training.loss (losses.py)
    # lm data whose ids were not scanned up front (the vocabulary was given): each batch's largest id
    # is checked, and one at or past num_classes raises this error (a ConfigError naming the file).
    id_error: Callable[[int], Exception] | None = None

    @property
    def prefetches(self) -> bool:
        """The training rows are read from a store that is worth reading ahead (formats/tokens_s3.py)."""
        return hasattr(self.train_x, "prefetch")

    def prefetch(self, batches: list[np.ndarray]) -> None:
        """Start reading these coming batches' rows in the background (where the source can)."""
        if self.prefetches:
            self.train_x.prefetch(batches)  # type: ignore[attr-defined]

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "lm":
            w = self.train_x.take(rows).astype(np.int64)
            if self.id_error is not None and w.size and (top := int(w.max())) >= self.num_classes:
                raise self.id_error(top)
            return w[:, :-1], w[:, 1:]
        assert self.train_y is not None
        return self.train_x.take(rows), self.train_y.take(rows)

    def test_batches(self) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "lm":
            w = self.test_x.astype(np.int64)
            return w[:, :-1], w[:, 1:]
        assert self.test_y is not None
        return self.test_x, self.test_y


def next_batch(ds: Dataset, sampler: GlobalBatchSampler) -> tuple[np.ndarray, np.ndarray]:
    """This rank's next batch; from object storage the batches after it are read meanwhile."""
    rows = sampler.next_indices()
    if ds.prefetches:
        ds.prefetch(sampler.peek_indices(PREFETCH_BATCHES))
    return ds.batch(rows)
