"""The local cluster's volume watcher, run as the cluster runs it (a process told by inotify),
on folders made the way kube-controller-manager's hostPath provisioner makes them (mode 0750),
and by a user other than their owner: it can write there only once the watcher opened them."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"
sys.path.insert(0, str(HACK))

from localcluster import volumewatch  # noqa: E402


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_volume_folder_is_opened_at_once_and_one_there_before_at_start(tmp_path: Path) -> None:
    root = tmp_path / "hostpath_pv"
    root.mkdir()
    before = root / "made-before-the-watcher"
    before.mkdir(mode=0o750)
    proc = subprocess.Popen([sys.executable, "-m", "localcluster.volumewatch", "--dir", str(root)],
                            env={**os.environ, "PYTHONPATH": str(HACK)}, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while mode(before) != 0o777:
            assert time.monotonic() < deadline, "the folder there at start was not opened"
            time.sleep(0.01)
        new = root / "f6a1c3e2-uuid"
        os.mkdir(new, 0o750)  # as the provisioner: os.MkdirAll(path, 0750)
        made = time.monotonic()
        while mode(new) != 0o777:
            # inotify, not the RESCAN_S safety net: well before a claim could bind and a pod start
            assert time.monotonic() - made < 1.0, "the new folder was not opened within a second"
            time.sleep(0.005)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"opened {new}" in out and f"opened {before}" in out


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A folder the trainer's uid can reach (pytest's own tmp folders are private to root)."""
    d = Path(tempfile.mkdtemp(prefix="volumewatch-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="writing as another user needs root")
def test_a_non_root_user_can_write_into_an_opened_folder_only(world_readable_dir: Path) -> None:
    root = world_readable_dir / "hostpath_pv"
    closed, opened = root / "closed", root / "opened"
    for d in (closed, opened):
        d.mkdir(parents=True, mode=0o750)
    root.chmod(0o755)
    assert sorted(volumewatch.open_volumes(root)) == [closed, opened]
    assert volumewatch.open_volumes(root) == []  # nothing left to open
    closed.chmod(0o750)  # back as the provisioner leaves it

    def write_as_trainer(folder: Path) -> int:
        return subprocess.run(["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", "sh", "-c",
                               f"echo ok > {folder}/checkpoint"], capture_output=True).returncode  # fmt: skip

    assert write_as_trainer(closed) != 0 and write_as_trainer(opened) == 0
    assert volumewatch.STORAGE_CLASS_OBJECT["provisioner"] == "kubernetes.io/host-path"
