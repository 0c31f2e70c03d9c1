"""Sharded (DCP) checkpoints are verified before they are picked: metadata readable, every file of
the manifest present with its size, every shard the metadata points into long enough, extra.pt loads.
Faults are injected into a real checkpoint written by sharded_checkpoint.save (one process)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from disttrain_trainer.checkpoints import sharded as sc
from disttrain_trainer.checkpoints import whole as ckpt

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _write(root: Path, step: int) -> Path:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    return sc.save(root, step, model=model, optimizer=opt, extra={"step": step}, keep=3, layout="dp=1,pp=1,tp=1").path


def _shard(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _garbage(f: Path) -> None:
    f.write_bytes(b"\xff" * f.stat().st_size)


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated shard": (lambda p: _truncate(_shard(p)), "distcp has"),
    "deleted shard": (lambda p: _shard(p).unlink(), "distcp is missing"),
    "garbage metadata": (lambda p: _garbage(p / sc.DCP_METADATA), ".metadata does not load"),
    "garbage extra": (lambda p: _garbage(p / sc.EXTRA_FILE), "extra.pt does not load"),
    "truncated extra": (lambda p: _truncate(p / sc.EXTRA_FILE), "extra.pt has"),
    "meta.json garbage": (lambda p: (p / ckpt.META_FILE).write_text("{not json"), "meta.json is missing or unreadable"),
}


def test_a_complete_checkpoint_verifies(tmp_path: Path) -> None:
    path = _write(tmp_path, 4)
    assert sc.verify(path) is None
    meta = json.loads((path / ckpt.META_FILE).read_text())
    assert meta["format"] == "dcp" and set(meta["files"]) == {p.name for p in path.iterdir()} - {ckpt.META_FILE}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_checkpoint_is_refused_with_the_reason(tmp_path: Path, fault: str) -> None:
    path = _write(tmp_path, 4)
    inject, reason = FAULTS[fault]
    inject(path)
    problem = sc.verify(path)
    assert problem is not None and reason in problem, problem


def test_without_a_manifest_the_dcp_metadata_still_catches_a_short_shard(tmp_path: Path) -> None:
    """Checkpoints written before the manifest existed: DCP's own offsets and lengths are checked."""
    path = _write(tmp_path, 4)
    meta = json.loads((path / ckpt.META_FILE).read_text())
    del meta["files"]
    (path / ckpt.META_FILE).write_text(json.dumps(meta))
    assert sc.verify(path) is None
    _truncate(_shard(path))
    problem = sc.verify(path)
    assert problem is not None and "needs" in problem, problem
