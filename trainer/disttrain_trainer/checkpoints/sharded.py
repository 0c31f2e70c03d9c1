"""Sharded checkpoints with torch.distributed.checkpoint (DCP): each rank writes its own part.

A checkpoint is `step-XXXXXXXX/` holding DCP's files (`.metadata` plus one
`.distcp` file per rank), `extra.pt` (scheduler, sampler, RNG, step: small,
written by rank 0) and `meta.json` (`"format": "dcp"`, the manifest of every
file's size, the writer's claim). All ranks write into one temp sibling; when
DCP's own final step has passed, rank 0 fsyncs, publishes and prunes it in the
directory layout of checkpoints/directory.py, whose full `state.pt` checkpoints sit
in the same folder and load here too. `verify` tells whether one can be loaded
before any rank reads it: a damaged newest checkpoint is moved aside and the
gang resumes from the one before, instead of failing on it at every restart. Nothing is unpickled
with the standard loader: DCP's `.metadata` through safe_state.SafeReader, its non-tensor items
through safe_state.SafeLoadPlanner, extra.pt weights-only.

Model and optimizer state go through `get_state_dict`/`set_state_dict`, which
key everything by parameter name (FQN) whatever the wrapping (DDP, FSDP2,
tensor-parallel DTensors). DCP stores every tensor with its global shape and
each shard's offsets, and loading reads whichever byte ranges the new layout's
shards need: a checkpoint saved under TP 2 loads into data 2, one process, or
DP 2 x TP 2, and back.
"""

from __future__ import annotations

import json
import re
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
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)

from . import directory as cdir
from . import fence, remote, safe_state
from . import whole as ckpt

FORMAT = "dcp"
EXTRA_FILE = "extra.pt"
DCP_METADATA = ".metadata"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _from_rank0(value: Any) -> Any:
    """Rank 0's `value` on every rank (itself without a process group)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def is_sharded_checkpoint(path: Path) -> bool:
    meta = cdir.read_meta(path)
    return (meta is not None and meta.get("format") == FORMAT) or (path / DCP_METADATA).is_file()


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Checkpoints of either format this process may pick, oldest first."""
    return [(e.step, e.path) for e in cdir.entries(root) if e.meta is not None
            and ((e.path / ckpt.STATE_FILE).is_file() or is_sharded_checkpoint(e.path))]  # fmt: skip


def verify(path: Path) -> str | None:
    """Why the DCP checkpoint `path` cannot be loaded, or None: its meta.json and DCP's metadata
    read, every file of the manifest has its recorded size, every shard file the metadata points
    into exists and holds the byte ranges it names, and extra.pt loads. Cheap: rank 0 reads the
    metadata and extra.pt, and only stats the shard files."""
    meta = cdir.read_meta(path)
    problem = cdir.manifest_problem(path, meta)
    if problem is not None:
        return problem
    try:
        metadata = safe_state.SafeReader(path).read_metadata()
    except Exception as e:  # noqa: BLE001 - whatever the unpickler says, the checkpoint is unusable
        return f"{DCP_METADATA} does not load: {type(e).__name__}: {e}"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            return f"shard file {name} is missing"
        if size < end:
            return f"shard file {name} has {size} bytes, {DCP_METADATA} needs {end}"
    try:
        safe_state.load(path / EXTRA_FILE)
    except Exception as e:  # noqa: BLE001
        return f"{EXTRA_FILE} does not load: {type(e).__name__}: {e}"
    return None


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
    """Collective: every rank calls it. Returns the size of the whole checkpoint on every rank.

    Raises fence.Fenced on every rank when a newer writer claimed `root`."""
    start = time.perf_counter()
    outcome: tuple[str, str] | None = None  # rank 0: (kind, message) when it cannot go on
    mine: fence.Claim | None = None
    tmp_name = ""
    if _rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            mine = fence.check(root, f"write {ckpt.name_for(step)}")
            tmp = root / f"{ckpt.TMP_PREFIX}{ckpt.name_for(step)}-{FORMAT}-{mine.generation}"
            shutil.rmtree(tmp, ignore_errors=True)  # left by this writer's own earlier try
            tmp.mkdir()
            tmp_name = tmp.name
        except fence.Fenced as e:
            outcome = ("fenced", str(e))
    tmp_name, outcome = _from_rank0((tmp_name, outcome))
    _raise(outcome)
    tmp = root / tmp_name
    mirrored = remote.remote_for(root) is not None
    if mirrored:  # each pod stages its own shards: rank 0's temp dir is not on this pod's disk
        tmp.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
    final = root / ckpt.name_for(step)
    failed: Exception | None = None
    if _rank() == 0:
        assert mine is not None
        try:
            _publish(root, tmp, step, extra=extra, keep=keep, layout=layout, writer=mine)
        except fence.Fenced as e:
            shutil.rmtree(tmp, ignore_errors=True)
            outcome = ("fenced", str(e))
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait forever
            outcome, failed = ("error", f"{type(e).__name__}: {e}"), e
    outcome = _from_rank0(outcome)  # nobody reads or re-saves before the rename
    if failed is not None:
        raise failed  # rank 0: its own error, with its traceback
    _raise(outcome)
    if mirrored:
        _publish_remote(root, tmp, final, keep)
    nbytes = _dir_bytes(final) if final.is_dir() else 0
    return ckpt.SaveResult(path=final, bytes=nbytes, seconds=time.perf_counter() - start)


def _publish_remote(root: Path, tmp: Path, final: Path, keep: int) -> None:
    """Collective, after the local publish: every rank uploads the shard files it wrote (rank 0 the
    rest too), and once every upload has finished rank 0 writes the commit marker (remote.py)."""
    rank, name = _rank(), final.name
    source = tmp if tmp.is_dir() else final  # another pod's rank: its shards stayed in its temp dir
    mine = re.compile(rf"^__{rank}_\d+\.distcp$")
    others = re.compile(r"^__\d+_\d+\.distcp$")
    files = sorted(f.name for f in source.iterdir() if f.is_file()
                   and (mine.match(f.name) or (rank == 0 and not others.match(f.name))))  # fmt: skip
    # Rank 0 checks its claim on the bucket and names the folder (its claim's) every rank uploads into.
    folder, outcome = "", None  # outcome: (kind, message) when rank 0 cannot go on
    if rank == 0:
        try:
            folder = remote.prepare(root, name) or ""
        except fence.Fenced as e:
            outcome = ("fenced", str(e))
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait forever
            outcome = ("error", f"{type(e).__name__}: {e}")
    folder, outcome = _from_rank0((folder, outcome))
    if outcome is not None and rank != 0 and source == tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    _raise(outcome)
    sizes: dict[str, int] = {}
    problem = ""
    try:
        sizes = remote.upload(root, source, folder, files)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait forever
        problem = f"rank {rank}: {type(e).__name__}: {e}"
    if rank != 0 and source == tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    parts: list[Any] = [(sizes, problem)]
    if dist.is_initialized():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (sizes, problem))
    problems = [p for _, p in parts if p]
    if problems:
        outcome = ("error", "; ".join(problems))
    elif rank == 0:
        try:
            remote.commit(root, name, {k: v for s, _ in parts for k, v in s.items()}, keep)
        except fence.Fenced as e:
            outcome = ("fenced", str(e))
        except Exception as e:  # noqa: BLE001
            outcome = ("error", f"{type(e).__name__}: {e}")
    _raise(_from_rank0(outcome))


def _raise(outcome: tuple[str, str] | None) -> None:
    if outcome is None:
        return
    kind, message = outcome
    if kind == "fenced":
        raise fence.Fenced(message)
    raise RuntimeError(f"rank 0 could not write the sharded checkpoint: {message}")


def _publish(root: Path, tmp: Path, step: int, *, extra: dict[str, Any], keep: int, layout: str,
             writer: fence.Claim) -> None:  # fmt: skip
    """Rank 0, once every rank's shards are on disk: extra.pt, meta.json with the manifest, publish, prune."""
    torch.save(safe_state.plain(extra, "extra"), tmp / EXTRA_FILE)
    cdir.fsync_file(tmp / EXTRA_FILE)
    files = cdir.manifest(tmp)
    world = dist.get_world_size() if dist.is_initialized() else 1
    meta = {"step": step, "world_size": world, "layout": layout, "bytes": sum(files.values()),
            "time": time.time(), "format": FORMAT, "files": files, "writer": writer.record()}  # fmt: skip
    (tmp / ckpt.META_FILE).write_text(json.dumps(meta))
    cdir.fsync_file(tmp / ckpt.META_FILE)
    cdir.fsync_dir(tmp)  # DCP's writer fsynced the shard files themselves
    final = cdir.publish(root, tmp, step)
    cdir.prune(root, keep, protect=final)


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """The model's full tensors keyed by name on rank 0 (empty elsewhere), gathered from whatever
    shards the ranks hold (FSDP2, tensor-parallel DTensors). Collective: every rank calls it."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state on rank 0 in whole.py's shape (keyed by parameter index, as
    `optimizer.state_dict()` of an unsharded model), gathered from the ranks' shards. Collective."""
    full = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not full:
        return {}
    index = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    return {
        "state": {index[n]: s for n, s in full["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]],
    }


def _named_optim_state(full: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """whole.py's optimizer state (keyed by parameter index) keyed by parameter name."""
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
        dcp.load(state, checkpoint_id=path, storage_reader=safe_state.SafeReader(path),
                 planner=safe_state.SafeLoadPlanner())  # fmt: skip
        set_state_dict(model, optims, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
        return safe_state.load(path / EXTRA_FILE)
    full = safe_state.load(path / ckpt.STATE_FILE)
    return load_full(full, model=model, optimizer=optimizer)


def load_full(full: dict[str, Any], *, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """A whole.py state (full tensors, already read) into this rank's shards; returns the rest."""
    optims = [optimizer] if optimizer is not None else []
    names = [n for n, _ in model.named_parameters()]
    # Every rank holds the full tensors; each keeps its own shard of them.
    set_state_dict(model, optims, model_state_dict=full["model"],
                   optim_state_dict=_named_optim_state(full["optimizer"], names) if optims else {},
                   options=StateDictOptions(full_state_dict=True))  # fmt: skip
    return {k: v for k, v in full.items() if k not in ("model", "optimizer")}
