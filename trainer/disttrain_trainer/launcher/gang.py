"""Start, watch and stop one attempt of a local gang of trainer processes.

Each child gets its own session (so Ctrl-C reaches only the launcher, which
then stops the gang in order) and, on Linux, a parent-death signal (so a
launcher killed with SIGKILL does not leave trainers blocked in a collective).
A trainer rank is forked from the launcher's forkserver where that starts it
as an exec would (forked_ranks.py), else exec'd.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from disttrain_api import exitcodes

from disttrain_trainer.launcher.env import Slot
from disttrain_trainer.launcher.forked_ranks import ForkedRank, RankForker

PIDS_FILE = "pids.json"
# A process killed by a signal takes its peers down with connection errors a moment later, and on a
# busy host the launcher can see a peer's exit before the killed one's (a forked rank's status comes
# through the forkserver, which reaps them in no set order). A failure that is a plain exit, while
# other ranks have not reported yet, is blamed only once they have or after this many seconds.
BLAME_SETTLE_S = 2.0
LOGS_DIR = "logs"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec (or in a forked rank)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass  # best effort: without it, stop() still cleans up on every normal path


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / LOGS_DIR / f"rank{rank}.log"


def tail_lines(path: Path, count: int, since: int = 0) -> list[str]:
    """Last `count` non-empty lines of a log, reading only from byte offset `since`."""
    try:
        with path.open("rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-count:]


@dataclass(frozen=True, kw_only=True)
class Failure:
    rank: int
    pid: int
    returncode: int
    log: Path
    log_tail: tuple[str, ...]
    # Whether this launcher had sent the process SIGTERM (Gang.stop) before it exited.
    stop_sent: bool = False

    @property
    def reason(self) -> str:
        last = self.log_tail[-1] if self.log_tail else "(no output)"
        return f"rank {self.rank} (pid {self.pid}) {describe_exit(self.returncode)}: {last}"

    @property
    def disruption(self) -> bool:
        """Exit STOPPED counts as a disruption (a restart not counted against backoffLimit) only
        when this launcher asked for the stop, as the operator counts it only for a pod that was
        being deleted or marked for disruption. A process that exits 3 on its own (its code did,
        or a SIGTERM from anyone else) failed: a model that exits 3 must not restart forever."""
        return self.returncode == exitcodes.STOPPED and self.stop_sent


@dataclass
class _Member:
    slot: Slot
    proc: subprocess.Popen[bytes] | ForkedRank
    log: Path
    log_offset: int  # where this attempt's output starts in the (appended) log
    command: Sequence[str] = ()
    env: dict[str, str] | None = None
    cwd: Path | None = None
    replacements: int = 0
    forker: RankForker | None = None


def start_rank(command: Sequence[str], env: dict[str, str], cwd: Path | None, path: Path, banner: str,
               forker: RankForker | None) -> tuple[subprocess.Popen[bytes] | ForkedRank, int]:  # fmt: skip
    """One rank, forked from `forker` where it can be (forked_ranks.forkable), else exec'd in a session
    of its own; either way it dies with its parent and appends its output to `path`, after a line
    with `banner`. Returns the process and the log's offset where its output begins."""
    with path.open("ab") as log:
        log.write(f"=== disttrain local: {banner} ===\n".encode())
        log.flush()
        offset = log.tell()
        forked = forker.start(command, env, cwd, path, _die_with_parent) if forker is not None else None
        if forked is not None:
            return forked, offset
        proc = subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return proc, offset


class Gang:
    """The processes of one attempt. Not thread-safe; poll from one loop."""

    def __init__(self, members: list[_Member], attempt: int):
        self._members = members
        self.attempt = attempt
        self.stop_sent: set[int] = set()  # pids this launcher sent SIGTERM
        self.lost: dict[int, Failure] = {}  # optional ranks that failed (see poll)
        self.run_dir: Path | None = None
        self._failure_seen: float | None = None  # when poll first saw a plain exit it did not blame yet

    @classmethod
    def start(
        cls,
        *,
        command: Sequence[str],
        envs: Sequence[tuple[Slot, dict[str, str]]],
        run_dir: Path,
        attempt: int,
        cwd: Path | None = None,
        forker: RankForker | None = None,
    ) -> Gang:
        (run_dir / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        members: list[_Member] = []
        try:
            for slot, env in envs:
                path = log_path(run_dir, slot.rank)
                proc, offset = start_rank(command, env, cwd, path, f"attempt {attempt}, rank {slot.rank}", forker)
                members.append(_Member(slot=slot, proc=proc, log=path, log_offset=offset,
                                       command=tuple(command), env=env, cwd=cwd, forker=forker))  # fmt: skip
        except BaseException:
            Gang(members, attempt).stop(grace_s=0)
            raise
        gang = cls(members, attempt)
        gang.run_dir = run_dir
        gang._write_pids(run_dir)
        return gang

    def replace(self, rank: int, env: dict[str, str] | None = None) -> int:
        """Start the exited process of `rank` again with the same environment (updated with `env`),
        alone (modes without gang restart: a parameter-server worker or shard, a fault-tolerant
        replica); returns the new pid."""
        m = next(m for m in self._members if m.slot.rank == rank)
        if m.proc.poll() is None or m.env is None:
            raise ValueError(f"rank {rank} is still running or was not started by this gang")
        if env:
            m.env = {**m.env, **env}
        m.replacements += 1
        m.proc, m.log_offset = start_rank(m.command, m.env, m.cwd, m.log,
                                          f"attempt {self.attempt}, rank {rank}, replacement {m.replacements}", m.forker)  # fmt: skip
        if self.run_dir is not None:
            self._write_pids(self.run_dir)
        return m.proc.pid

    def _write_pids(self, run_dir: Path) -> None:
        # Tests and operators of a local run find the processes here (e.g. to kill rank 1).
        data = {
            "attempt": self.attempt,
            "pids": {str(m.slot.rank): m.proc.pid for m in self._members},
        }
        tmp = run_dir / (PIDS_FILE + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, run_dir / PIDS_FILE)

    def states(self) -> dict[int, int | None]:
        """Each rank's exit code, None while it runs."""
        return {m.slot.rank: m.proc.poll() for m in self._members}

    @property
    def pids(self) -> dict[int, int]:
        return {m.slot.rank: m.proc.pid for m in self._members}

    def poll(self, optional: frozenset[int] = frozenset()) -> Failure | bool:
        """False while running, True when every process exited 0, a Failure otherwise.

        Ranks in `optional` (federated clients) may fail without failing the gang: their
        failures collect in `lost`, and the gang succeeds when all other ranks exited 0.
        """
        codes = [(m, m.proc.poll()) for m in self._members]
        for m, rc in codes:
            if m.slot.rank in optional and rc is not None and rc != 0 and m.slot.rank not in self.lost:
                self.lost[m.slot.rank] = Failure(
                    rank=m.slot.rank, pid=m.proc.pid, returncode=rc, log=m.log,
                    log_tail=tuple(tail_lines(m.log, 8, since=m.log_offset)), stop_sent=m.proc.pid in self.stop_sent,
                )  # fmt: skip
        codes = [(m, rc) for m, rc in codes if m.slot.rank not in optional]
        failed = [(m, rc) for m, rc in codes if rc is not None and rc != 0]
        if failed:
            # A rank that rejected the config decides the outcome (no restart can help),
            # even if a peer that lost its connection to it exited first. Otherwise a
            # killed process takes its peers down with connection errors a moment
            # later: blame the one that died of a signal, else the lowest rank seen.
            failed.sort(
                key=lambda mr: (mr[1] not in exitcodes.PERMANENT, mr[1] >= 0, mr[0].slot.rank)
            )
            m, rc = failed[0]
            assert rc is not None
            if rc >= 0 and rc not in exitcodes.PERMANENT and any(c is None for _, c in codes):
                now = time.monotonic()
                self._failure_seen = self._failure_seen if self._failure_seen is not None else now
                if now - self._failure_seen < BLAME_SETTLE_S:
                    return False  # a killed peer's status may still be on its way
            self._failure_seen = None
            return Failure(
                rank=m.slot.rank,
                pid=m.proc.pid,
                returncode=rc,
                log=m.log,
                log_tail=tuple(tail_lines(m.log, 8, since=m.log_offset)),
                stop_sent=m.proc.pid in self.stop_sent,
            )
        return all(rc == 0 for _, rc in codes)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process group, then SIGKILL whatever outlives the grace period."""
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for m in self._members:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                m.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                pass
        self._signal_all(signal.SIGKILL)
        for m in self._members:
            m.proc.wait()

    def kill(self, ranks: Iterable[int]) -> None:
        """SIGKILL the processes of `ranks` that still run and wait for them (a fault-tolerant replica
        group whose world lost a member: they would only wait on their dead peer)."""
        chosen = set(ranks)
        members = [m for m in self._members if m.slot.rank in chosen]
        self._signal_all(signal.SIGKILL, members)
        for m in members:
            m.proc.wait()

    def _signal_all(self, sig: signal.Signals, members: Iterable[_Member] | None = None) -> None:
        for m in self._members if members is None else members:
            if m.proc.poll() is not None:
                continue
            if sig == signal.SIGTERM:
                self.stop_sent.add(m.proc.pid)
            try:
                os.killpg(
                    m.proc.pid, sig
                )  # the session leader's group: includes any helpers it spawned
            except ProcessLookupError:
                pass
