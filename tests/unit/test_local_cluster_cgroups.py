"""Stopping a local-cluster node kills every process in its cgroup tree while the kubelet's and
runc's own cleanup removes the containers' cgroups under the walk. The walk must skip a cgroup
that went, not raise (FileNotFoundError from Path.rglob failed an e2e node-loss test once).

Real cgroup v1 folders (the pids hierarchy the cluster uses), removed by a thread for real while
the walk runs; no cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))

from localcluster.config import CGROUP_PARENT  # noqa: E402
from localcluster.proc import cgroup_pids, controllers, hierarchies  # noqa: E402


def _pids_hierarchy() -> Path:
    found = [h for h in hierarchies() if "pids" in controllers(h)]
    assert found, "no cgroup v1 pids hierarchy is mounted: the local cluster needs one"
    return found[0]


def test_the_walk_skips_cgroups_removed_under_it_and_still_finds_the_live_process() -> None:
    rel = f"unit-walk-{uuid.uuid4().hex[:8]}"
    top = _pids_hierarchy() / CGROUP_PARENT / rel
    keep = top / "keep"
    keep.mkdir(parents=True)
    churn = [top / f"c{i:02d}" / "inner" for i in range(40)]
    sleeper = subprocess.Popen(["sleep", "60"])
    stop = threading.Event()

    def remove_and_recreate() -> None:  # what the kubelet does to a pod's containers' cgroups
        while not stop.is_set():
            for d in churn:
                d.mkdir(parents=True, exist_ok=True)
            for d in churn:
                for x in (d, d.parent):
                    try:
                        x.rmdir()
                    except OSError:
                        pass

    t = threading.Thread(target=remove_and_recreate, daemon=True)
    try:
        (keep / "cgroup.procs").write_text(str(sleeper.pid))
        t.start()
        for _ in range(300):
            assert sleeper.pid in cgroup_pids(rel)
    finally:
        stop.set()
        t.join(timeout=10)
        sleeper.kill()
        sleeper.wait()
        # back to the root cgroup, then the folders can go
        for root, dirs, _files in os.walk(top, topdown=False):
            for d in dirs:
                try:
                    Path(root, d).rmdir()
                except OSError:
                    pass
        top.rmdir()


def test_a_daemons_cgroup_has_cpus_at_every_level_and_the_daemon_weight() -> None:
    """Every level of a new cgroup gets its parent's cpus and mems (a v1 cpuset child starts
    empty, and no process can join it then), and a cgroup daemons run in gets DAEMON_CPU_SHARES."""
    from localcluster.proc import DAEMON_CPU_SHARES, ensure_cgroup, remove_cgroups

    top = f"unit-ensure-{uuid.uuid4().hex[:8]}"
    rel = f"{top}/system"
    try:
        ensure_cgroup(rel, daemons=True)
        for h in hierarchies():
            if "cpuset" in controllers(h):
                for level in (h / CGROUP_PARENT / top, h / CGROUP_PARENT / rel):
                    assert (level / "cpuset.cpus").read_text().strip(), level
                    assert (level / "cpuset.mems").read_text().strip(), level
            if "cpu" in controllers(h):
                assert int((h / CGROUP_PARENT / rel / "cpu.shares").read_text()) == DAEMON_CPU_SHARES
                assert int((h / CGROUP_PARENT / top / "cpu.shares").read_text()) == 1024  # not a daemons' cgroup
    finally:
        remove_cgroups(top)
