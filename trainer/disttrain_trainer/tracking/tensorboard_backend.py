"""TensorBoard event files of the tracked process's scalars (torch.utils.tensorboard).

The writer is opened at the first record, with that record's step as `purge_step`: a process
resumed from a checkpoint logs again from the step after it, and TensorBoard's reader drops what
an earlier attempt wrote at that step and later (its events past the checkpoint) instead of
drawing two curves over the same steps. Every process start writes a new event file into the
same folder; `tensorboard --logdir <folder>` reads them as one run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .background import Final, Scalars
from .scalars import summary_scalars

# How often the writer flushes to disk: a live `tensorboard --logdir` sees the run within this.
FLUSH_S = 10


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._writer: Any = None

    def _open(self, first_step: int) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - tensorboard (a second to import)

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.logdir), purge_step=first_step, flush_secs=FLUSH_S)
        return self._writer

    def write(self, items: list[Scalars]) -> None:
        w = self._open(items[0].step)
        for item in items:
            for tag, value in item.values.items():
                w.add_scalar(tag, value, global_step=item.step, walltime=item.wall_time)

    def finish(self, final: Final) -> None:
        if final.summary is not None:
            w = self._open(final.step)
            for tag, value in summary_scalars(final.summary).items():
                w.add_scalar(tag, value, global_step=final.step)
            w.add_text("summary", "```\n" + json.dumps(final.summary, indent=2, sort_keys=True) + "\n```",
                       global_step=final.step)  # fmt: skip
        if self._writer is not None:
            self._writer.close()
            self._writer = None
