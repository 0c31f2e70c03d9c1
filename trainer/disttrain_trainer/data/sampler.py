"""The global-batch sampler: deterministic, resumable, independent of the world size.

It walks one seeded permutation of the whole training set per epoch; rank r of W takes the r-th
W-th of every global batch, which makes W processes see exactly the samples one process would
see with the same global batch (and lets a checkpoint written at world size 2 resume at world
size 1: the position is global).
"""

from __future__ import annotations

import numpy as np

from ..process.config import ConfigError


class GlobalBatchSampler:
    """Deterministic global batches; rank r of `world` gets the r-th contiguous slice of each one.

    State is global (epoch, offset), so it is the same on every rank and survives a
    change of world size. A partial batch at the end of an epoch is dropped so every
    global batch has exactly `batch_size` samples.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        # Both fail the same way on every retry: ConfigError, so the job is not restarted.
        if batch_size % world:
            raise ConfigError(
                f"data.batchSize {batch_size} must be divisible by the data-parallel size {world}"
            )
        if batch_size > num_samples:
            raise ConfigError(
                f"data.batchSize {batch_size} exceeds the {num_samples} training samples"
            )
        self.n, self.batch, self.seed, self.rank, self.world = (
            num_samples,
            batch_size,
            seed,
            rank,
            world,
        )
        self.epoch, self.offset = 0, 0
        self._perm: np.ndarray | None = None

    def _permutation(self) -> np.ndarray:
        if self._perm is None:
            self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        return self._perm

    def next_global(self) -> np.ndarray:
        if self.offset + self.batch > self.n:
            self.epoch, self.offset, self._perm = self.epoch + 1, 0, None
        out = self._permutation()[self.offset : self.offset + self.batch]
        self.offset += self.batch
        return out

    def next_indices(self) -> np.ndarray:
        """This rank's slice of the next global batch."""
        per = self.batch // self.world
        return self.next_global()[self.rank * per : (self.rank + 1) * per]

    def peek_indices(self, ahead: int) -> list[np.ndarray]:
        """What the next `ahead` calls of next_indices will return, without moving the sampler."""
        saved = (self.epoch, self.offset, self._perm)
        try:
            return [self.next_indices() for _ in range(ahead)]
        finally:
            self.epoch, self.offset, self._perm = saved

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "batch_size": self.batch,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset, self._perm = int(state["epoch"]), int(state["offset"]), None
