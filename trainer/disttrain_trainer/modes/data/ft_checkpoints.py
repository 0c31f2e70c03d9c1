"""Periodic checkpoints of fault-tolerant replicas: the fallback when the whole gang restarts.

Every replica reads the newest checkpoint when it starts, as a reader (no claim on the directory,
nothing moved aside): a replica that joins a running job starts from it and is then brought to
the quorum's step by a live peer; a gang that starts over resumes from it. Only the replica that
is rank 0 of the quorum writes, and that replica changes when one fails, so the writer claims the
directory (checkpoints/fence.py) right before a write and claims it again when another replica of
its own restart attempt claimed it since. A claim of a newer attempt still fences it: the fencing
against replaced gangs holds, within a gang the quorum decides who writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...checkpoints import fence
from ...checkpoints import whole as ckpt
from ...telemetry.step_metrics import Metrics


def read_newest(root: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint under `root` that loads, read without claiming the directory."""
    for step, _path in reversed(ckpt.list_checkpoints(root)):
        try:
            return step, ckpt.load(root, step)
        except Exception:  # noqa: BLE001, S112 - damaged or half-visible: an older one may load; the writer moves it aside
            continue
    return None


def read_step(root: Path, step: int) -> dict[str, Any]:
    """Checkpoint `step` under `root`, read without claiming the directory."""
    return ckpt.load(root, step)


class ReplicaCheckpoints:
    """The writes of one replica: in the background (checkpoints/whole.AsyncSaver), at most one in flight."""

    def __init__(self, root: Path, *, keep: int, world_size: int, writer: fence.Writer, metrics: Metrics) -> None:
        self.root, self.keep, self.world_size, self.writer, self.metrics = root, keep, world_size, writer, metrics
        self.saver: ckpt.AsyncSaver | None = None

    def claim(self) -> None:
        """Hold the newest claim on the directory before writing into it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if fence.held(self.root) is None:
            fence.claim(self.root, self.writer)
            return
        try:
            fence.check(self.root, "write a checkpoint")
        except fence.Fenced:
            # Another replica of this attempt wrote since (it was rank 0 of the quorum then), or a
            # newer attempt claimed: claim() refuses the latter with Fenced.
            self.report(wait=True)
            fence.claim(self.root, self.writer)

    def save(self, state: dict[str, Any], step: int) -> float:
        """Start writing checkpoint `step`; returns the seconds the caller was held up."""
        self.claim()
        if self.saver is None:
            self.saver = ckpt.AsyncSaver(self.root, keep=self.keep, world_size=self.world_size)
        stall = self.saver.save(state, step)
        self.metrics.observe_checkpoint_stall(step, stall)
        return stall

    def report(self, *, wait: bool = False) -> None:
        """Record the writes that finished; `wait` for the one in flight. A write fenced by another
        replica of this attempt is that replica's turn, not an error."""
        if self.saver is None:
            return
        try:
            done = self.saver.wait() if wait else self.saver.poll()
        except fence.Fenced:
            if fence.newest_attempt(self.root) > self.writer.attempt:
                raise
            print("disttrain-trainer: another replica writes the checkpoints now; this replica's write was "
                  "left to it", flush=True)  # fmt: skip
            return
        for res in done:
            self.metrics.observe_checkpoint(int(res.path.name.rsplit("-", 1)[1]), res.seconds, res.bytes)

    def has(self, step: int) -> bool:
        return any(s == step for s, _ in ckpt.list_checkpoints(self.root))
