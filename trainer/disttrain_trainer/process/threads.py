"""The CPUs this process may really use, and torch's threads per rank from them.

`os.cpu_count()` is the node's cores. In a pod with a CPU limit the kernel gives the container
only its CFS quota per period (cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, v2 `cpu.max`),
and a cpuset or `taskset` narrows the affinity: a pod limited to 4 CPUs on a 64-core node that
runs 64 threads is throttled every period and loses most of its time waiting. So the cores a
process counts are min(affinity, quota), rounded down (a fraction of a core runs no thread),
at least 1.

The cgroup is the process's own (/proc/self/cgroup names it; inside a container it is the
root of the cgroup mount), and any limit set above it in the hierarchy caps it too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

THREADS_ENV = "OMP_NUM_THREADS"  # torch's (OpenMP's, MKL's) threads per process, read at import
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def _own_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu controller path) of this process, from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(root: Path, path: str | None) -> list[Path]:
    """`root`/path and every folder above it up to `root` (a limit on any of them applies)."""
    out = [root]
    if path:
        cur = root
        for part in [p for p in path.split("/") if p]:
            cur = cur / part
            out.append(cur)
    return [p for p in out if p.is_dir()]


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period) if int(period) > 0 else None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None  # -1: no limit


def cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in cores (the smallest on its path), None without one.

    `root`: where the cgroup file system is mounted (a test gives a folder of fake files)."""
    v2_path, v1_path = _own_paths(proc_cgroup)
    limits: list[float] = []
    if (root / "cgroup.controllers").exists():  # cgroup v2: one unified hierarchy
        limits += [x for f in _ancestors(root, v2_path) if (x := _v2_limit(f)) is not None]
    else:  # cgroup v1: the cpu controller's own hierarchy (mounted as cpu or cpu,cpuacct)
        mount = next((m for m in (root / "cpu", root / "cpu,cpuacct") if (m / "cpu.cfs_quota_us").exists()), None)
        if mount is not None:
            limits += [x for f in _ancestors(mount, v1_path) if (x := _v1_limit(f)) is not None]
    return min(limits) if limits else None


def usable_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP,
                 affinity: int | None = None) -> float:  # fmt: skip
    """The CPUs this process may use: its affinity, capped by its cgroup's quota (fractional)."""
    cores = float(affinity if affinity is not None else len(os.sched_getaffinity(0)))
    quota = cpu_quota(root, proc_cgroup)
    return min(cores, quota) if quota is not None else cores


def threads_per_rank(ranks_on_host: int, cores: float | None = None) -> int:
    """torch threads for each of `ranks_on_host` ranks sharing this host's usable cores."""
    usable = usable_cores() if cores is None else cores
    return max(1, math.floor(usable) // max(1, ranks_on_host))
