"""How long a run will still take after its last step, from what this run measured so far: the
ETA (disttrain_api/progress.py) adds it to the steps left over the step rate.

After the last step rank 0 evaluates the model on the whole held-out set, exports it, and
writes the final checkpoint in the foreground (its snapshot, then the write the trainer waits
for). Their costs:
- evaluation: the last periodic evaluation's duration; until one, a timed forward pass over a
  few batches of the held-out set, scaled to all of it (run_common.probe_eval_seconds), taken before the
  first step and again after log intervals 1, 4, 16, 64, ... (`probe_due`), the fastest one
  standing (`observe_probe`): anything else on the host (the background checkpoint write, another
  process) only ever slows a probe down, and the final evaluation runs alone;
- checkpoint: the last checkpoint's snapshot stall + its (background) write;
- export: the model's bytes at the last checkpoint's write throughput (an export writes the
  model alone; a checkpoint also the optimizer state).
A cost not measured yet counts 0: the estimate says what is known, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(kw_only=True, slots=True)
class FinishEstimate:
    eval_s: float | None = None
    eval_timed: bool = False  # eval_s is a whole evaluation's, not a probe's
    checkpoint_stall_s: float | None = None
    checkpoint_write_s: float | None = None
    checkpoint_bytes: int | None = None
    export_bytes: int | None = None  # the model's state, as the export writes it

    def observe_probe(self, seconds: float) -> None:
        """A probe's estimate of the evaluation, until a whole one was timed: the fastest stands."""
        if not self.eval_timed:
            self.eval_s = seconds if self.eval_s is None else min(self.eval_s, seconds)

    def export_s(self) -> float | None:
        if not (self.export_bytes and self.checkpoint_bytes and self.checkpoint_write_s):
            return None
        return self.export_bytes * self.checkpoint_write_s / self.checkpoint_bytes

    def seconds(self) -> float:
        parts = (self.eval_s, self.checkpoint_stall_s, self.checkpoint_write_s, self.export_s())
        return sum(p for p in parts if p is not None)


def probe_due(interval: int) -> bool:
    """Whether to probe the evaluation again after log interval `interval` (1, 4, 16, 64, ...):
    a handful of probes over any run, each at most about PROBE_MAX_S."""
    while interval > 1 and interval % 4 == 0:
        interval //= 4
    return interval == 1


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model's state (a sharded tensor counts whole: the export gathers it)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values() if isinstance(t, torch.Tensor))
