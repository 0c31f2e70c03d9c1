"""AsyncSaver: snapshots are independent of training, one write in flight, errors surface, atomic layout kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt


def test_snapshot_is_a_copy_training_cannot_change() -> None:
    w = torch.ones(4)
    state = {"model": {"w": w}, "opt": [{"m": torch.zeros(2)}], "rng": (np.arange(3), 7), "step": 5}
    snap = ckpt.snapshot(state)
    w.add_(1.0)
    state["opt"][0]["m"].add_(2.0)
    state["rng"][0][0] = 99
    assert torch.equal(snap["model"]["w"], torch.ones(4))
    assert torch.equal(snap["opt"][0]["m"], torch.zeros(2))
    assert snap["rng"][0][0] == 0 and snap["step"] == 5


def test_async_saves_complete_in_order_and_keep_the_newest(tmp_path: Path) -> None:
    saver = ckpt.AsyncSaver(tmp_path, keep=2, world_size=2)
    w = torch.zeros(1000)
    for step in (10, 20, 30):
        w.fill_(float(step))
        stall = saver.save({"w": w}, step)  # the next save first waits for this one
        w.fill_(-1.0)  # training goes on while the write runs: the checkpoint must not see it
        assert stall >= 0.0
    done = saver.wait()
    assert [r.path.name for r in done] == [ckpt.name_for(s) for s in (10, 20, 30)]
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [20, 30]
    step, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert step == 30 and torch.equal(state["w"], torch.full((1000,), 30.0))
    assert saver.wait() == [] and saver.poll() == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)]


def test_a_failed_background_write_is_raised_to_the_caller(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    saver = ckpt.AsyncSaver(blocker / "ckpts", keep=2, world_size=1)
    saver.save({"w": torch.ones(2)}, 1)
    with pytest.raises(RuntimeError, match="checkpoint write"):
        saver.wait()


def test_snapshot_reuses_the_buffers_of_a_written_snapshot() -> None:
    first = ckpt.snapshot({"w": torch.ones(3), "m": [torch.zeros(2)]})
    buf = first["w"]
    second = ckpt.snapshot({"w": torch.full((3,), 2.0), "m": [torch.ones(2)]}, first)
    assert second["w"] is buf and torch.equal(buf, torch.full((3,), 2.0))
    assert torch.equal(second["m"][0], torch.ones(2))
    # A different shape gets a fresh tensor.
    third = ckpt.snapshot({"w": torch.ones(4)}, second)
    assert third["w"] is not buf and third["w"].shape == (4,)
