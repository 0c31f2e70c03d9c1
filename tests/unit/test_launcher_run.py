"""The launcher's view of a finished gang: every rank's finished file of this attempt."""

from __future__ import annotations

import json
from pathlib import Path

from disttrain_trainer.launcher.run import all_finished, clear_finished
from disttrain_trainer.process.config import finished_path


def _mark(run_dir: Path, rank: int, attempt: int) -> None:
    finished_path(run_dir, rank).write_text(json.dumps({"step": 40, "restartAttempt": attempt}))


def test_all_ranks_of_this_attempt_must_have_finished(tmp_path: Path) -> None:
    assert not all_finished(tmp_path, 2, attempt=1)
    _mark(tmp_path, 0, 1)
    assert not all_finished(tmp_path, 2, attempt=1)  # rank 1 still missing
    _mark(tmp_path, 1, 0)
    assert not all_finished(tmp_path, 2, attempt=1)  # rank 1's file is from an earlier attempt
    _mark(tmp_path, 1, 1)
    assert all_finished(tmp_path, 2, attempt=1)
    finished_path(tmp_path, 1).write_text("{torn")
    assert not all_finished(tmp_path, 2, attempt=1)


def test_clear_removes_only_finished_files(tmp_path: Path) -> None:
    _mark(tmp_path, 0, 0)
    _mark(tmp_path, 1, 0)
    (tmp_path / "summary.json").write_text("{}")
    clear_finished(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
