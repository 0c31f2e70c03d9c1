"""Sharded checkpoints with torch.distributed.checkpoint (DCP): each rank writes its own part.

A checkpoint is `step-XXXXXXXX/` holding DCP's files (`.metadata` plus one
`.distcp` file per rank), `extra.pt` (scheduler, sampler, RNG, step: small,
written by rank 0) and `meta.json` (`"format": "dcp"`). All ranks write into
one temp sibling; when DCP's own final barrier has passed, rank 0 fsyncs,
renames it into place and prunes, the same atomic protocol as checkpoint.py,
whose full `state.pt` checkpoints sit in the same folder and load here too.

Model and optimizer state go through `get_state_dict`/`set_state_dict`, which
key everything by parameter name (FQN) whatever the wrapping (DDP, FSDP2,
tensor-parallel DTensors). DCP stores every tensor with its global shape and
each shard's offsets, and loading reads whichever byte ranges the new layout's
shards need: a checkpoint saved under TP 2 loads into data 2, one process, or
DP 2 x TP 2, and back.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from . import checkpoint as ckpt

FORMAT = "dcp"
EXTRA_FILE = "extra.pt"
DCP_METADATA = ".metadata"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / DCP_METADATA).is_file() and (path / EXTRA_FILE).is_file()


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of either format, oldest first."""
    if not root.is_dir():
        return []
    found = dict(ckpt.list_checkpoints(root))
    for child in root.iterdir():
        m = ckpt._NAME.match(child.name)  # noqa: SLF001 - one definition of the directory name
        if m and (child / ckpt.META_FILE).is_file() and is_sharded_checkpoint(child):
            found[int(m.group(1))] = child
    return sorted(found.items())


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def save(
    root: Path,
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep: int,
    layout: str,
) -> ckpt.SaveResult:
    """Collective: every rank calls it. Returns the size of the whole checkpoint on every rank."""
    start = time.perf_counter()
    tmp = root / f"{ckpt.TMP_PREFIX}{ckpt.name_for(step)}-{FORMAT}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a gang that died mid-save
        tmp.mkdir()
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
    final = root / ckpt.name_for(step)
    if _rank() == 0:
        torch.save(extra, tmp / EXTRA_FILE)
        ckpt._fsync_file(tmp / EXTRA_FILE)  # noqa: SLF001
        nbytes = _dir_bytes(tmp)
        world = dist.get_world_size() if dist.is_initialized() else 1
        meta = {"step": step, "world_size": world, "layout": layout, "bytes": nbytes,
                "time": time.time(), "format": FORMAT}  # fmt: skip
        (tmp / ckpt.META_FILE).write_text(json.dumps(meta))
        ckpt._fsync_file(tmp / ckpt.META_FILE)  # noqa: SLF001
        ckpt._fsync_dir(tmp)  # noqa: SLF001 - DCP's writer fsynced the shard files themselves
        if final.exists():
            old = root / f"{ckpt.TMP_PREFIX}old-{final.name}-{os.getpid()}"
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, final)
        ckpt._fsync_dir(root)  # noqa: SLF001
        for _, path in list_checkpoints(root)[:-keep] if keep > 0 else []:
            shutil.rmtree(path, ignore_errors=True)
    _barrier()  # nobody reads or re-saves before the rename
    return ckpt.SaveResult(path=final, bytes=_dir_bytes(final), seconds=time.perf_counter() - start)


def _named_optim_state(full: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """checkpoint.py's optimizer state (keyed by parameter index) keyed by parameter name."""
    return {
        "state": {names[int(i)]: s for i, s in full["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in full["param_groups"]],
    }


def load(path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Load `path` (either format) into this rank's shards of model and optimizer; returns the rest.

    Collective for a sharded model. The optimizer must have been built on the
    model's (sharded) parameters; its state is created here when it has none yet."""
    optims = [optimizer] if optimizer is not None else []
    if is_sharded_checkpoint(path):
        model_sd, optim_sd = get_state_dict(model, optims)
        state: dict[str, Any] = {"model": model_sd}
        if optims:
            state["optimizer"] = optim_sd
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optims, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
        return torch.load(path / EXTRA_FILE, map_location="cpu", weights_only=False)
    full = torch.load(path / ckpt.STATE_FILE, map_location="cpu", weights_only=False)
    return load_full(full, model=model, optimizer=optimizer)


def load_full(full: dict[str, Any], *, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """A checkpoint.py state (full tensors, already read) into this rank's shards; returns the rest."""
    optims = [optimizer] if optimizer is not None else []
    names = [n for n, _ in model.named_parameters()]
    # Every rank holds the full tensors; each keeps its own shard of them.
    set_state_dict(model, optims, model_state_dict=full["model"],
                   optim_state_dict=_named_optim_state(full["optimizer"], names) if optims else {},
                   options=StateDictOptions(full_state_dict=True))  # fmt: skip
    return {k: v for k, v in full.items() if k not in ("model", "optimizer")}
