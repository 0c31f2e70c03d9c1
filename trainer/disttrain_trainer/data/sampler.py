"""The global-batch sampler: deterministic, resumable, independent of the world size, and of a
memory that does not grow with the data set.

Epoch e's order is a seeded permutation of the training rows (permutation.py, keyed by
(seed, e)), evaluated per position: the sampler computes the positions of the coming batches a
window at a time (WINDOW positions, or the whole epoch when it is smaller) and keeps at most
KEEP_WINDOWS windows, so a 2-billion-window corpus costs what a small one does. Rank r of W takes
the r-th W-th of every global batch, which makes W processes see exactly the samples one process
would see with the same global batch (and lets a checkpoint written at world size 2 resume at
world size 1: the position is global).

The state (epoch, offset) is the same on every rank. It names its order (ORDER): a checkpoint
written by the sampler before this one (which drew a whole permutation per epoch with numpy)
has none and is refused, since its batches cannot be continued exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from ..process.config import ConfigError
from .permutation import Permutation

ORDER = "feistel-v1"  # the order a state's (epoch, offset) counts in
WINDOW = 1 << 16  # positions of an epoch's order computed at once (int64: 512 KiB)
KEEP_WINDOWS = 4  # enough for a batch across two windows while the next batches are peeked


class GlobalBatchSampler:
    """Deterministic global batches; rank r of `world` gets the r-th contiguous slice of each one.

    A partial batch at the end of an epoch is dropped so every global batch has exactly
    `batch_size` samples.
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
        self.n, self.batch, self.seed, self.rank, self.world = num_samples, batch_size, seed, rank, world
        self.epoch, self.offset = 0, 0
        self._windows: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def _window(self, epoch: int, w: int) -> np.ndarray:
        """Positions [w * WINDOW, (w + 1) * WINDOW) of epoch `epoch`'s order."""
        key = (epoch, w)
        found = self._windows.get(key)
        if found is None:
            perm = Permutation(self.n, (self.seed, epoch))
            if self.n <= WINDOW:
                found = perm.table()
            else:
                found = perm(np.arange(w * WINDOW, min(self.n, (w + 1) * WINDOW), dtype=np.int64))
            self._windows[key] = found
            while len(self._windows) > KEEP_WINDOWS:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(key)
        return found

    def _positions(self, start: int, stop: int) -> np.ndarray:
        """The rows at positions [start, stop) of the current epoch's order."""
        first, last = start // WINDOW, (stop - 1) // WINDOW
        if first == last:
            return self._window(self.epoch, first)[start - first * WINDOW : stop - first * WINDOW]
        return np.concatenate([
            self._window(self.epoch, w)[max(start, w * WINDOW) - w * WINDOW : min(stop, (w + 1) * WINDOW) - w * WINDOW]
            for w in range(first, last + 1)
        ])  # fmt: skip

    def _advance(self) -> int:
        """Move past the next global batch; its first position in the (possibly new) epoch."""
        if self.offset + self.batch > self.n:
            self.epoch, self.offset = self.epoch + 1, 0
        start = self.offset
        self.offset += self.batch
        return start

    def next_global(self) -> np.ndarray:
        start = self._advance()
        return self._positions(start, start + self.batch)

    def next_indices(self) -> np.ndarray:
        """This rank's slice of the next global batch (only its positions are looked up)."""
        start = self._advance() + self.rank * (self.batch // self.world)
        return self._positions(start, start + self.batch // self.world)

    def peek_indices(self, ahead: int) -> list[np.ndarray]:
        """What the next `ahead` calls of next_indices will return, without moving the sampler."""
        saved = (self.epoch, self.offset)
        try:
            return [self.next_indices() for _ in range(ahead)]
        finally:
            self.epoch, self.offset = saved

    def seek(self, epoch: int, offset: int) -> None:
        """Continue at position `offset` of epoch `epoch` (this sampler's own order)."""
        self.epoch, self.offset = epoch, offset

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "batch_size": self.batch,
                "order": ORDER}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("order") != ORDER:
            raise ConfigError(
                f"the checkpoint's sampler position (epoch {state.get('epoch')}, offset {state.get('offset')}) counts "
                f"in the order of an older trainer ({state.get('order') or 'a numpy permutation per epoch'}), which "
                f"this trainer ({ORDER}) cannot continue exactly; finish the run with the image that wrote it, or "
                "start it afresh (remove its checkpoints, or give the job another name; disttrain local --fresh)"
            )
        self.seek(int(state["epoch"]), int(state["offset"]))
