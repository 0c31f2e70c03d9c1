"""What Linux's /proc says about a running process, for the benchmarks that measure one."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (FileNotFoundError once it is gone)."""
    # The command name in parentheses may hold spaces: the fields start after the last ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """The pids a process started (empty once it is gone)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its children, theirs, ...), as far as they are still running."""
    out, todo = [], children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children(child))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """cpu_seconds of `pid` and its running descendants together; a process that ended meanwhile
    counts 0 (its CPU is gone from /proc with it)."""
    total = 0.0
    for p in (pid, *descendants(pid)):
        try:
            total += cpu_seconds(p)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total
