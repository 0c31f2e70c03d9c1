"""Checkpoint helpers: atomic directory layout, newest-k pruning, partial temp dirs ignored and cleaned,
unreadable checkpoints moved aside (never deleted, never counted toward `keep`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt


def test_save_keep_and_load_latest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        res = ckpt.save(tmp_path, {"w": torch.full((3,), float(step))}, step, keep=2, world_size=2)
        assert res.bytes > 0 and res.path.name == f"step-{step:08d}"
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [30, 40]
    step, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 40 and torch.equal(state["w"], torch.full((3,), 40.0))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)]


def test_partial_and_corrupt_checkpoints_are_skipped(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"w": torch.ones(2)}, 5, keep=3, world_size=1)
    partial = tmp_path / f"{ckpt.TMP_PREFIX}step-00000010-abc"
    partial.mkdir()
    (partial / ckpt.STATE_FILE).write_bytes(b"\x00" * 10)
    torn = tmp_path / ckpt.name_for(
        8
    )  # complete-looking dir with garbage: skipped, older one loads
    torn.mkdir()
    (torn / ckpt.STATE_FILE).write_bytes(b"garbage")
    (torn / ckpt.META_FILE).write_text("{}")
    step, _ = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 5
    assert ckpt.clean_partial(tmp_path) == [partial] and not partial.exists()


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"v": 1}, 7, keep=3, world_size=1)
    ckpt.save(tmp_path, {"v": 2}, 7, keep=3, world_size=1)
    assert ckpt.load_latest(tmp_path)[1] == {"v": 2}  # type: ignore[index]
    # Only the checkpoint; the dot-entries are the writers' claims (.fence), no leftover copy.
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".fence")] == [ckpt.name_for(7)]


def test_truncated_state_is_rejected_by_its_byte_count(tmp_path: Path) -> None:
    # Checkpoints are written without zip CRCs (speed); the byte count in meta.json
    # is what catches a state file that lost its tail.
    ckpt.save(tmp_path, {"w": torch.ones(1000)}, 1, keep=3, world_size=1)
    res = ckpt.save(tmp_path, {"w": torch.full((1000,), 2.0)}, 2, keep=3, world_size=1)
    state_file = res.path / ckpt.STATE_FILE
    state_file.write_bytes(state_file.read_bytes()[:-16])
    step, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 1 and torch.equal(state["w"], torch.ones(1000))


def _damage(path: Path, fault: str) -> None:
    state = path / ckpt.STATE_FILE
    data = state.read_bytes()
    if fault == "truncate":
        state.write_bytes(data[: len(data) // 2])
    elif fault == "garbage":  # same size: only loading it tells
        state.write_bytes(bytes(range(256)) * (len(data) // 256) + b"\x00" * (len(data) % 256))
    else:
        state.unlink()


@pytest.mark.parametrize("fault", ["truncate", "garbage", "delete"])
def test_keep_1_with_a_corrupt_newest_keeps_every_new_checkpoint(tmp_path: Path, fault: str) -> None:
    """The newest checkpoint is damaged; the job resumes from the one before and saves with keep 1.
    The damaged one must neither outrank the new ones in pruning nor be deleted."""
    ckpt.save(tmp_path, {"w": torch.full((500,), 100.0)}, 100, keep=2, world_size=1)
    newest = ckpt.save(tmp_path, {"w": torch.full((500,), 150.0)}, 150, keep=2, world_size=1).path
    _damage(newest, fault)
    damaged = {p.name: p.read_bytes() for p in newest.iterdir()}
    step, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 100 and torch.equal(state["w"], torch.full((500,), 100.0))
    for step in (110, 120):
        ckpt.save(tmp_path, {"w": torch.full((500,), float(step))}, step, keep=1, world_size=1)
        assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [step]  # the one just written survives
    step, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 120 and torch.equal(state["w"], torch.full((500,), 120.0))
    aside = tmp_path / f"{ckpt.name_for(150)}.corrupt"
    assert aside.is_dir(), sorted(p.name for p in tmp_path.iterdir())
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == damaged  # moved, not rewritten or deleted


def test_prune_moves_a_damaged_checkpoint_aside_instead_of_counting_it(tmp_path: Path) -> None:
    for step in (10, 20):
        ckpt.save(tmp_path, {"w": torch.full((500,), float(step))}, step, keep=3, world_size=1)
    _damage(tmp_path / ckpt.name_for(20), "truncate")  # damaged after it was written, before any restart
    ckpt.save(tmp_path, {"w": torch.ones(500)}, 30, keep=2, world_size=1)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10, 30]
    assert (tmp_path / f"{ckpt.name_for(20)}.corrupt").is_dir()
