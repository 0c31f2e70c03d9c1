"""Which checkpoint a starting gang resumes from: one that every rank loads, agreed on by rank 0.

Rank 0 claims the checkpoint directory for this gang's restart attempt (fence.py:
a writer of a replaced gang is fenced off from then on), then picks the newest
checkpoint that is complete *and loads*, and broadcasts its step; every other
rank loads exactly that step. An unreadable one is moved aside (`step-N.corrupt`),
so the whole gang falls back to the previous one together. When the caller can
take a sharded (DCP) checkpoint and the newest good one is one, rank 0 verifies
it (sharded.verify) and names it instead: every rank reads its own shards of it;
a load that still fails on it (`reject`) moves it aside too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..process.dist_env import DistContext
from . import directory as cdir
from . import fence, remote
from . import sharded as sharded_ckpt
from . import whole as ckpt


class CheckpointNotVisible(RuntimeError):
    """Rank 0 loaded a checkpoint this rank cannot read yet; transient (the shared volume may lag)."""


def agree_on_checkpoint(
    root: Path, ctx: DistContext, *, writer: fence.Writer, sharded: bool = False
) -> tuple[int, dict[str, Any] | Path] | None:
    """The newest checkpoint that rank 0 can load completely, loaded on every rank; None: start fresh.

    Rank 0 first takes the directory over as `writer` (raises fence.Fenced when a newer
    attempt claimed it). With `sharded`, a verified DCP checkpoint newer than every good full one
    comes back as its path: every rank then reads its own shards of it (sharded.load).
    One broadcast either way, so every rank issues the same collectives whatever it finds on its volume."""
    loaded: tuple[int, dict[str, Any] | Path] | None = None
    refused = ""
    if ctx.is_main:
        try:
            cdir.take_over(root, writer)
            loaded = _pick(root, sharded=sharded)
        except fence.Fenced as e:
            refused = str(e)
    picked = None
    if loaded is not None:  # spec.checkpoint.uri: the marker rank 0's copy came from, for the other pods
        picked = (loaded[0], isinstance(loaded[1], Path), remote.source_of(root, ckpt.name_for(loaded[0])))
    choice = [refused or picked]
    dist.broadcast_object_list(choice, src=0)
    if isinstance(choice[0], str):
        raise fence.Fenced(choice[0])
    if choice[0] is None:
        return None
    step, is_dcp, marker = choice[0]
    if not ctx.is_main:  # spec.checkpoint.uri: a pod of its own downloads what rank 0 picked
        remote.ensure_local(root, ckpt.name_for(step), marker)
    if is_dcp:
        return step, root / ckpt.name_for(step)
    if loaded is None:
        try:
            loaded = step, ckpt.load(root, step)
        except Exception as e:  # noqa: BLE001 - any read error here is the volume's, not the job's
            raise CheckpointNotVisible(
                f"rank {ctx.rank} cannot read checkpoint step {step} under {root} that rank 0 "
                f"loaded ({e}); the checkpoint volume must be shared by all workers"
            ) from None
    return loaded


def _pick(root: Path, *, sharded: bool) -> tuple[int, dict[str, Any] | Path] | None:
    """Rank 0: the newest checkpoint that loads (full) or verifies (DCP, with `sharded`); the ones
    in between are moved aside. Without `sharded` DCP checkpoints are not candidates."""
    if not sharded:
        return ckpt.load_latest(root)
    for step, path in reversed(sharded_ckpt.list_checkpoints(root)):
        if sharded_ckpt.is_sharded_checkpoint(path):
            problem = sharded_ckpt.verify(path)
            if problem is None:
                return step, path
            cdir.quarantine(path, problem)
            continue
        try:
            return step, ckpt.load(root, step)
        except Exception as e:  # noqa: BLE001 - a damaged file must not stop the job; an older one may load
            cdir.quarantine(path, f"{type(e).__name__}: {e}")
    return None


def reject(path: Path, ctx: DistContext, error: BaseException) -> None:
    """Every rank failed to load the agreed DCP checkpoint `path` (DCP raises a read error on all
    ranks alike): rank 0 moves it aside, so the next agree_on_checkpoint picks the one before."""
    if ctx.is_main:
        cdir.quarantine(path, f"{type(error).__name__}: {str(error).strip()[:300]}")
    dist.barrier()
