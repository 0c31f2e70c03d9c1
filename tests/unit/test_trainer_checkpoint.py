"""Checkpoint helpers: atomic directory layout, newest-k pruning, partial temp dirs ignored and cleaned."""

from __future__ import annotations

from pathlib import Path

import torch
from disttrain_trainer import checkpoint as ckpt


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
    assert len(list(tmp_path.iterdir())) == 1


def test_truncated_state_is_rejected_by_its_byte_count(tmp_path: Path) -> None:
    # Checkpoints are written without zip CRCs (speed); the byte count in meta.json
    # is what catches a state file that lost its tail.
    ckpt.save(tmp_path, {"w": torch.ones(1000)}, 1, keep=3, world_size=1)
    res = ckpt.save(tmp_path, {"w": torch.full((1000,), 2.0)}, 2, keep=3, world_size=1)
    state_file = res.path / ckpt.STATE_FILE
    state_file.write_bytes(state_file.read_bytes()[:-16])
    step, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 1 and torch.equal(state["w"], torch.ones(1000))
