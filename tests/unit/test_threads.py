"""The CPUs a process may use (affinity, cgroup v1 and v2 CPU quota) and torch's threads per rank
from them, read from fake cgroup folders laid out as the kernel mounts them."""

from __future__ import annotations

from pathlib import Path

import pytest
from disttrain_trainer.launcher.env import default_threads
from disttrain_trainer.process.threads import cpu_quota, threads_per_rank, usable_cores


def _v2(tmp: Path, own: str, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp / "cgroup"
    (root / own.strip("/")).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    for folder, value in limits.items():
        (root / folder.strip("/") / "cpu.max").write_text(value + "\n")
    proc = tmp / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def _v1(tmp: Path, mount: str, own: str, limits: dict[str, tuple[int, int]]) -> tuple[Path, Path]:
    root = tmp / "cgroup"
    (root / mount / own.strip("/")).mkdir(parents=True)
    (root / "memory").mkdir()
    for folder, (quota, period) in limits.items():
        (root / mount / folder.strip("/") / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (root / mount / folder.strip("/") / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp / "proc-self-cgroup"
    proc.write_text(f"12:memory:{own}\n4:cpu,cpuacct:{own}\n1:name=systemd:/\n")
    return root, proc


def test_v2_quota_of_the_pod_caps_the_node_cores(tmp_path: Path) -> None:
    # A pod limited to 4 CPUs (400000 us per 100000 us) on a 64-core node: 4 cores, 2 threads for 2 ranks.
    root, proc = _v2(tmp_path, "/kubepods/pod1/ctr", {"/": "max 100000", "/kubepods/pod1": "400000 100000",
                                                      "/kubepods/pod1/ctr": "max 100000"})  # fmt: skip
    assert cpu_quota(root, proc) == 4.0
    cores = usable_cores(root, proc, affinity=64)
    assert cores == 4.0 and threads_per_rank(2, cores) == 2 and threads_per_rank(8, cores) == 1


def test_v1_quota_and_a_fraction_of_a_core(tmp_path: Path) -> None:
    root, proc = _v1(tmp_path, "cpu,cpuacct", "/kubepods/burstable/pod2/c1",
                     {"/": (-1, 100000), "/kubepods/burstable/pod2": (250000, 100000),
                      "/kubepods/burstable/pod2/c1": (-1, 100000)})  # fmt: skip
    assert cpu_quota(root, proc) == 2.5
    assert usable_cores(root, proc, affinity=16) == 2.5
    assert threads_per_rank(1, 2.5) == 2  # half a core runs no thread of its own


def test_v1_inside_a_container_reads_the_mount_root(tmp_path: Path) -> None:
    # Without a cgroup namespace /proc/self/cgroup names the host's path, which the container's
    # mount does not hold: its root is the container's own cgroup.
    root, proc = _v1(tmp_path, "cpu", "/", {"/": (150000, 100000)})
    proc.write_text("4:cpu,cpuacct:/kubepods/podX/abc\n")
    assert cpu_quota(root, proc) == 1.5


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/user.slice", {"/user.slice": "max 100000"})
    assert cpu_quota(root, proc) is None
    assert usable_cores(root, proc, affinity=3) == 3.0
    assert cpu_quota(tmp_path / "missing", tmp_path / "missing-proc") is None
    assert threads_per_rank(4, 3.0) == 1


@pytest.mark.parametrize(("world", "cores", "threads"), [(2, 2, 1), (2, 16, 8), (8, 2, 1), (2, 4.5, 2)])
def test_local_runs_share_the_usable_cores(world: int, cores: float, threads: int) -> None:
    assert default_threads(world, cpu_count=cores) == threads
