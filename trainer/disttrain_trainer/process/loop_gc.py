"""Python's cyclic garbage collector kept out of the steps of a training loop.

Every step allocates hundreds of short-lived Python objects (tensors, autograd closures,
the loop's records). With automatic collection on, they trigger a generation-0 pass every
few steps and, now and then, a full pass over everything the process holds (torch, the
model, the data: about 250 000 objects), which lands inside whichever step crossed the
threshold. Measured on the digits MLP with 2 gloo ranks, turning it off raised loop
throughput by 3-6%. torchtitan does the same (automatic collection off, the young
generations collected every `gc_freq` steps); so does this: the objects alive when the
loop starts are frozen (moved out of every future pass), automatic collection is off
inside the loop, and generations 0-1 are collected every `every` steps, between steps.
"""

from __future__ import annotations

import gc
from types import TracebackType

# Between two collections the loop's reference cycles (few: tensors are freed by reference
# counting) wait in memory; 100 steps keep that small and the collection out of the per-step cost.
COLLECT_EVERY_STEPS = 100


class LoopGC:
    """`with LoopGC() as gc_: ... gc_.after_step(step)`; restores the collector on exit."""

    def __init__(self, every: int = COLLECT_EVERY_STEPS) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self._was_enabled = False

    def __enter__(self) -> LoopGC:
        self._was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        return self

    def after_step(self, step: int) -> None:
        if step % self.every == 0:
            gc.collect(1)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
