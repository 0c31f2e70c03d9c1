"""The trained model out of a run: `<checkpoint dir>/export/` with model.safetensors (the model's
state_dict names, full tensors) and model.json (the model spec that built it, the step, the mode).

Rank 0 writes it at the end of a successful run, before the final checkpoint (which carries the
summary naming it): a run killed in between trains its last steps again and exports again. The
directory is published atomically: written into a temp sibling, fsynced, then swapped in; the
previous export is renamed aside first and removed only once the new one is in place, so a crash
leaves a complete export under `export/` or, at worst for one instant, under `export.old-*`.
A writer fenced off the checkpoint directory (a replaced gang) publishes nothing.

An hf: model's export is a Hugging Face directory (weights/hf_export.py: config.json,
model.safetensors, the tokenizer), with model.json beside it.

`model.init` accepts the export directory as it is (weights/initial.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from disttrain_api import constants as C
from disttrain_api.model import JobSpec, to_json
from safetensors.torch import save_file

from ..checkpoints import directory as cdir
from ..checkpoints import fence, remote
from . import hf_export

TMP_PREFIX = ".export-tmp-"
OLD_PREFIX = C.EXPORT_DIRNAME + ".old-"
FORMAT = 1


def export_dir(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / C.EXPORT_DIRNAME


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Full tensors, on the CPU, contiguous and each its own storage: safetensors refuses tensors
    that share memory (tied weights), and a clone is what a loader gets back anyway."""
    return {n: t.detach().to("cpu").contiguous().clone() for n, t in state.items() if isinstance(t, torch.Tensor)}


def write_export(checkpoint_dir: Path, state: dict[str, Any], *, spec: JobSpec, step: int) -> dict[str, Any]:
    """Publish `state` as the export; returns the summary's `export` entry. One process calls it."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    fence.check(checkpoint_dir, "write the export")
    for stale in checkpoint_dir.glob(TMP_PREFIX + "*"):  # left by a writer killed mid-export
        shutil.rmtree(stale, ignore_errors=True)
    tensors = _tensors(state)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=checkpoint_dir))
    try:
        weights = C.EXPORT_WEIGHTS_FILENAME
        if spec.model.hf_dir is not None:
            weights = hf_export.write(tmp, tensors, spec=spec)
        else:
            save_file(tensors, str(tmp / weights), metadata={"format": "pt"})
        info = {"format": FORMAT, "step": step, "mode": spec.mode, "time": time.time(),
                "model": to_json(spec.model), "tensors": len(tensors),
                "parameters": sum(t.numel() for t in tensors.values())}  # fmt: skip
        (tmp / C.EXPORT_SPEC_FILENAME).write_text(json.dumps(info, indent=2, sort_keys=True))
        for f in tmp.iterdir():
            cdir.fsync_file(f)
        cdir.fsync_dir(tmp)
        final = export_dir(checkpoint_dir)
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    uri = remote.upload_export(checkpoint_dir, final)  # spec.checkpoint.uri: beside the checkpoints there
    return {"path": uri or str(final), "weights": weights, "step": step,
            "bytes": sum(f.stat().st_size for f in final.glob("*.safetensors"))}  # fmt: skip


def _swap_in(tmp: Path, final: Path) -> None:
    old: Path | None = None
    if final.exists():
        old = final.with_name(f"{OLD_PREFIX}{os.getpid()}-{time.time_ns()}")
        os.rename(final, old)
    os.rename(tmp, final)
    cdir.fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in final.parent.glob(OLD_PREFIX + "*"):  # a crash between the two renames above
        shutil.rmtree(leftover, ignore_errors=True)


def export_on_rank0(state_of: Callable[[], dict[str, Any] | None], *, checkpoint_dir: Path, spec: JobSpec,
                    step: int, is_main: bool) -> dict[str, Any]:  # fmt: skip
    """Collective when a process group exists: rank 0 exports what `state_of()` returns (called on
    every rank: gathering sharded state is collective; only rank 0's result is used) and every rank
    learns the outcome, so a failed write fails the whole gang rather than leaving it waiting."""
    state = state_of()
    outcome: list[Any] = [None, ""]  # the export entry, or why rank 0 could not write it
    if is_main:
        assert state is not None
        try:
            outcome = [write_export(checkpoint_dir, state, spec=spec, step=step), ""]
        except fence.Fenced as e:
            outcome = [None, f"fenced: {e}"]
        except (OSError, RuntimeError, ValueError) as e:  # a disk, or the object store (checkpoints/remote.py)
            outcome = [None, f"{type(e).__name__}: {e}"]
    if dist.is_initialized():
        dist.broadcast_object_list(outcome, src=0)
    if outcome[1].startswith("fenced: "):
        raise fence.Fenced(outcome[1][len("fenced: "):])
    if outcome[1]:
        raise RuntimeError(f"rank 0 could not export the model into {export_dir(checkpoint_dir)}: {outcome[1]}")
    return outcome[0]
