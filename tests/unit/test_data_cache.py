"""The data cache, built once per job: of several processes (the pods of a job share the folder)
one builds an entry while the others wait and then read it; a builder killed mid-build leaves
nothing that is read, and releases its lock by dying; where the cache lies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from disttrain_api import constants as C
from disttrain_trainer.data.cache import CACHE_FOLDER, default_cache_dir

BUILDER = r"""
import os, sys, time
from pathlib import Path
from disttrain_trainer.data.cache import build_once

root, hold, others = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

def build(tmp):
    (tmp / "part").write_text("half")
    with open(root / "builds.log", "a") as f:
        f.write(f"{os.getpid()}\n")
    (root / "building").touch()
    while len(list(root.glob("ready-*"))) < others:  # the others are at the lock now
        time.sleep(0.05)
    time.sleep(hold)
    (tmp / "done").write_text("whole")

if others == 0:
    (root / f"ready-{os.getpid()}").touch()
build_once(root / "cache" / "entry-1", build, done="done", what="the test's source")
print((root / "cache" / "entry-1" / "done").read_text())
"""


def start(tmp_path: Path, hold: float, others: int = 0) -> subprocess.Popen[str]:
    """A process that builds the entry (holding it `hold` s after `others` more processes arrived)."""
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path), str(hold), str(others)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_one_process_builds_while_the_others_wait_and_read_its_entry(tmp_path: Path) -> None:
    first = start(tmp_path, hold=0.5, others=3)
    wait_for(tmp_path / "building")  # the first one holds the lock: the others must wait for it
    others = [start(tmp_path, hold=0.0) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in [first, *others]]
    assert all(p.returncode == 0 for p in [first, *others]), outs
    assert [o.strip() for o, _ in outs] == ["whole"] * 4
    assert len((tmp_path / "builds.log").read_text().split()) == 1  # built once
    assert all("waiting for entry-1: another process builds it" in e and "is ready" in e for _, e in outs[1:]), outs
    assert sum("building entry-1 from the test's source" in e for _, e in outs) == 1


def test_a_builder_killed_midway_leaves_nothing_read_and_no_lock_held(tmp_path: Path) -> None:
    victim = start(tmp_path, hold=60.0)
    wait_for(tmp_path / "building")
    partial = list((tmp_path / "cache").glob(".tmp-entry-1-*"))
    assert len(partial) == 1 and (partial[0] / "part").exists()
    os.kill(victim.pid, signal.SIGKILL)  # no cleanup runs: its temporary folder stays
    victim.communicate(timeout=30)
    assert not (tmp_path / "cache" / "entry-1").exists()  # the partial output was never published
    (tmp_path / "building").unlink()
    t0 = time.monotonic()
    out, err = start(tmp_path, hold=0.0).communicate(timeout=120)
    assert time.monotonic() - t0 < 60  # the dead builder's lock went with it
    assert out.strip() == "whole" and "partial output of a builder that did not finish" in err, err
    assert not list((tmp_path / "cache").glob(".tmp-entry-1-*"))
    assert len((tmp_path / "builds.log").read_text().split()) == 2


def test_the_cache_is_on_the_checkpoint_volume_unless_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(C.ENV_DATA_CACHE, raising=False)
    monkeypatch.delenv(C.ENV_CHECKPOINT_DIR, raising=False)
    assert default_cache_dir(str(tmp_path)) == tmp_path / CACHE_FOLDER
    monkeypatch.setenv(C.ENV_CHECKPOINT_DIR, str(tmp_path / "ckpt"))  # the env contract's root wins
    (tmp_path / "ckpt").mkdir()
    assert default_cache_dir("/checkpoints") == tmp_path / "ckpt" / CACHE_FOLDER
    monkeypatch.setenv(C.ENV_CHECKPOINT_DIR, str(tmp_path / "absent"))  # no volume: the temp folder
    assert default_cache_dir("/checkpoints").name == "disttrain-data"
    monkeypatch.setenv(C.ENV_DATA_CACHE, str(tmp_path / "mine"))
    assert default_cache_dir(str(tmp_path)) == tmp_path / "mine"
