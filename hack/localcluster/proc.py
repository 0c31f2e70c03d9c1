"""Running commands and daemons, and killing exactly the processes the cluster started."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .config import CGROUP_PARENT

CGROUP_FS = Path("/sys/fs/cgroup")
# Hierarchies a daemon joins before exec: pids, so that stopping a node can find every process
# of it (daemons, containerd shims, containers) by reading cgroup.procs of the node's pids
# cgroup; cpu, so that the weights below apply to the daemons too.
JOIN_HIERARCHIES = ("pids", "freezer", "systemd", "cpu", "cpuacct")
# cpu.shares of the cluster's parent cgroup. In cgroup v1 a process of the root cgroup weighs
# as much as a whole child cgroup (1024 each), so with the default the entire cluster (API
# server, kubelets, every pod) got the CPU of one host process: a test suite running six busy
# processes beside it left the pods a seventh of the machine, and pods that start in seconds
# on an idle machine missed their tests' minutes-long deadlines. Eight processes' worth keeps
# the cluster responsive beside a busy host; the pods' own CPU limits still bound what it takes.
CLUSTER_CPU_SHARES = 8 * 1024
# cpu.shares of a cgroup daemons run in (the control plane's, a node's `system`) beside its
# siblings: each node's cgroup (1024) for the control plane, the node's pods (`kubepods`, which
# the kubelet weighs at its CPU capacity) for the kubelet and containerd. With the defaults the
# API server ran in the host's root cgroup at one process's weight, beside pods weighing eight:
# under a CI run's load it answered the kubelets' lease renewals seconds late, both nodes
# turned NotReady and the taint manager evicted a training job's pods. The daemons use little
# CPU; the weight only decides who waits when the machine is full.
DAEMON_CPU_SHARES = 8 * 1024


class ClusterError(RuntimeError):
    """A step of bring-up failed; says which step and which log to read."""

    def __init__(self, step: str, message: str, log: Path | None = None) -> None:
        self.step, self.log = step, log
        where = f" (log: {log})" if log else ""
        tail = ""
        if log and log.exists():
            lines = log.read_text(errors="replace").splitlines()[-15:]
            tail = "\n  | " + "\n  | ".join(lines) if lines else ""
        super().__init__(f"local cluster step '{step}' failed: {message}{where}{tail}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock: concurrent test sessions must not build or (re)start at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def say(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    step: str,
    check: bool = True,
    timeout: float = 300,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    args = [str(c) for c in cmd]
    try:
        res = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, env=env, input=input
        )
    except subprocess.TimeoutExpired:
        raise ClusterError(step, f"{' '.join(args)} timed out after {timeout:.0f}s", log) from None
    except FileNotFoundError:
        raise ClusterError(step, f"{args[0]} not found; run `make cluster-prereqs`") from None
    if log is not None:
        with log.open("a") as fh:
            fh.write(f"$ {' '.join(args)}\n{res.stdout}{res.stderr}")
    if check and res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().splitlines()[-5:]
        raise ClusterError(step, f"{' '.join(args)} exited {res.returncode}: {' | '.join(msg)}", log)
    return res


def hierarchies() -> list[Path]:
    """Mounted cgroup v1 hierarchies (combined ones like cpu,cpuacct once; symlinks skipped)."""
    return [
        h
        for h in sorted(CGROUP_FS.iterdir())
        if h.is_dir() and not h.is_symlink() and (h / "cgroup.procs").exists() and h.name != "unified"
    ]


def controllers(h: Path) -> set[str]:
    return set(h.name.replace("name=", "").split(","))


def cgroup_dirs(rel: str) -> list[Path]:
    """The folder `rel` (under our parent) in every mounted v1 hierarchy."""
    return [h / CGROUP_PARENT / rel if rel else h / CGROUP_PARENT for h in hierarchies()]


def ensure_cgroup(rel: str, *, daemons: bool = False) -> None:
    """Create `rel` in every v1 hierarchy (kubelet needs its cgroupRoot everywhere), the
    cluster's parent at CLUSTER_CPU_SHARES and, for a cgroup that `daemons` run in, `rel` at
    DAEMON_CPU_SHARES; cpuset children start empty, so copy cpus/mems down or nothing can join them."""
    for h in hierarchies():
        cur = h
        for part in Path(CGROUP_PARENT, rel).parts:
            cur = cur / part
            cur.mkdir(exist_ok=True)
            if "cpu" in controllers(h) and cur.parent == h:
                (cur / "cpu.shares").write_text(str(CLUSTER_CPU_SHARES))
            if "cpuset" in controllers(h):
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (cur / f).read_text().strip():
                        (cur / f).write_text((cur.parent / f).read_text())
        if "cpu" in controllers(h) and daemons and rel:
            (cur / "cpu.shares").write_text(str(DAEMON_CPU_SHARES))


def join_cpu_cgroup(rel: str) -> None:
    """Move the processes of our cgroup `rel` (as the pids hierarchy lists them) into `rel` of
    the cpu hierarchies: daemons a cluster started before they joined those stay where they
    were until then, at one host process's weight."""
    ensure_cgroup(rel, daemons=True)
    pids = cgroup_pids(rel)
    for h in hierarchies():
        if not controllers(h) & {"cpu", "cpuacct"}:
            continue
        for pid in pids:
            try:
                (h / CGROUP_PARENT / rel / "cgroup.procs").write_text(str(pid))
            except OSError:  # exited since the listing
                pass


def cgroup_pids(rel: str) -> set[int]:
    pids: set[int] = set()
    for h in hierarchies():
        d = h / CGROUP_PARENT / rel if rel else h / CGROUP_PARENT
        if "pids" not in controllers(h) or not d.exists():
            continue
        # os.walk, not Path.rglob: the kubelet removes a container's cgroup while we walk (the
        # processes we kill end), and rglob raises on a directory that went; os.walk skips it.
        for root, _dirs, files in os.walk(d):
            if "cgroup.procs" not in files:
                continue
            try:
                pids.update(int(x) for x in Path(root, "cgroup.procs").read_text().split())
            except OSError:
                pass
    return {p for p in pids if alive(p)}


def kill_cgroup(rel: str, timeout: float = 15) -> None:
    """SIGKILL everything in our cgroup `rel` until it is empty (processes may fork meanwhile)."""
    deadline = time.monotonic() + timeout
    while pids := cgroup_pids(rel):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise ClusterError("kill", f"processes {sorted(pids)} in cgroup {rel} survive SIGKILL")
        time.sleep(0.1)


def remove_cgroups(rel: str) -> None:
    """rmdir the cgroup tree depth-first in every hierarchy (only empty cgroups can go),
    including the v2 `unified` one where runc mirrors v1 cgroups on hybrid hosts."""
    unified = CGROUP_FS / "unified"
    extra = [unified / CGROUP_PARENT / rel if rel else unified / CGROUP_PARENT] if unified.is_dir() else []
    for d in [*cgroup_dirs(rel), *extra]:
        if not d.exists():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            d.rmdir()
        except OSError:
            pass


def spawn(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    log: Path,
    cgroup: str,
    env: dict[str, str] | None = None,
) -> int:
    """Start a daemon in its own session (it outlives `make cluster-up`), in cgroup `cgroup`."""
    ensure_cgroup(cgroup, daemons=True)
    targets = [
        h / CGROUP_PARENT / cgroup / "cgroup.procs"
        for h in hierarchies()
        if controllers(h) & set(JOIN_HIERARCHIES)
    ]

    def join() -> None:
        for t in targets:
            t.write_text(str(os.getpid()))

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [str(c) for c in cmd],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=join,
            env=env,
        )
    return proc.pid


def alive(pid: int) -> bool:
    """False for gone or zombie processes (reaping our own zombie children on the way)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def wait_for(what: str, probe: Callable[[], bool], *, timeout: float, step: str, log: Path | None = None, pid: int | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        if pid is not None and not alive(pid):
            raise ClusterError(step, f"process {pid} exited while waiting for {what}", log)
        time.sleep(0.2)
    raise ClusterError(step, f"timed out after {timeout:.0f}s waiting for {what}", log)
