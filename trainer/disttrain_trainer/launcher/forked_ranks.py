"""Rank processes forked from a server that imported torch once (multiprocessing's forkserver).

`python -m disttrain_trainer` spends seconds of CPU before its first step: importing torch and the
mode's loop, then (when DDP is built) torch._dynamo; about 7-10 s per process on a 2-core machine.
Every rank of a local gang imports the same modules, and every gang restart or replaced rank
imports them again. Here one forkserver per launcher imports most of them once (PRELOAD), and each
rank is a fork of it: the first rank still waits for the imports, the others and every restart
start at once.

A rank is forked only when an exec would start it the same way: the command is this Python running
`-m disttrain_trainer`, and its environment differs from the launcher's only in variables that are
read after start-up (`READ_AT_RUN`: the process contract, read when the trainer runs;
PYTHONUNBUFFERED, applied to the streams). Anything else (a PYTHONPATH or a TORCH_* flag in the
job's env, which the interpreter or torch reads while it starts) starts the rank with exec, as does
a platform without a forkserver. OMP_NUM_THREADS is one of those: torch's thread pools (OpenMP,
MKL) read it as torch is imported, and torch.set_num_threads in the fork is not the same: two
replicas forked so from a server started without it, both at 1 thread, ended one float32 bit apart
under PowerSGD's compression (3 runs in 6), never when the server started with the ranks' count.
So the forkserver starts with the thread count the launcher gives its ranks (`threads`).

A forked rank behaves as an exec'd one towards the launcher: its own session, its output appended
to its log, a pid in pids.json that `kill -9` ends, its exit code (negative for a signal) from
`poll`/`wait`. It is the forkserver's child, not the launcher's; the forkserver exits when the
launcher does (its pipe from the launcher closes), and the rank's parent-death signal then ends it,
so a launcher killed with SIGKILL still leaves no trainer behind.
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.context
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from disttrain_api import constants as C

from disttrain_trainer.launcher.env import trainer_command
from disttrain_trainer.process.rank_imports import PRELOAD, TRAINER_MODULE
from disttrain_trainer.process.threads import THREADS_ENV

FORKSERVER_LOG = "forkserver.log"  # in the run's logs folder
# Variables a trainer reads only once it runs: they may differ between ranks and the forkserver.
READ_AT_RUN = frozenset({
    C.ENV_MASTER_ADDR, C.ENV_MASTER_PORT, C.ENV_WORLD_SIZE, C.ENV_RANK, C.ENV_LOCAL_RANK, C.ENV_NODE_RANK,
    C.ENV_NPROC_PER_NODE, C.ENV_FT_LIGHTHOUSE, C.ENV_AWS_ACCESS_KEY_ID, C.ENV_AWS_SECRET_ACCESS_KEY,
    C.ENV_AWS_ENDPOINT_URL, C.ENV_AWS_REGION, C.ENV_AWS_DEFAULT_REGION,
    "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES",
})  # fmt: skip
READ_AT_RUN_PREFIX = "DISTTRAIN_"
# The environment the forkserver started with (multiprocessing keeps one per process): what its
# interpreter and torch read, and so what a forked rank inherits.
_server_env: dict[str, str] | None = None


def forkable(command: Sequence[str], env: Mapping[str, str], launcher_env: Mapping[str, str]) -> bool:
    """Whether a fork of the forkserver starts `command` with `env` as an exec would."""
    if list(command) != trainer_command(sys.executable):
        return False
    keys = set(env) | set(launcher_env)
    return all(env.get(k) == launcher_env.get(k) for k in keys
               if k not in READ_AT_RUN and not k.startswith(READ_AT_RUN_PREFIX))  # fmt: skip


def _stream(fd: int, unbuffered: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False),  # noqa: SIM115
                            encoding="utf-8", errors="backslashreplace", line_buffering=True,
                            write_through=unbuffered)  # fmt: skip


def _release_forkserver() -> None:
    """Close this fork's end of the pipe that keeps the forkserver running. multiprocessing gives
    every fork one (so that it may ask for forks itself) and the forkserver runs until all of them
    are closed; a rank that kept it would keep the forkserver alive after a launcher killed with
    SIGKILL, and the forkserver's death is what ends the rank then (its parent-death signal)."""
    from multiprocessing import forkserver  # noqa: PLC0415 - loaded already: this is its child

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if server is not None and fd is not None:
        os.close(fd)
        server._forkserver_alive_fd = None


def _rank_main(env: dict[str, str], cwd: str | None, log: str, setup: Callable[[], None]) -> None:
    """The forked rank: what an exec of `python -m disttrain_trainer` would have set up, then the
    trainer. Its exit code is the trainer's (multiprocessing exits with SystemExit's code)."""
    os.setsid()
    setup()
    _release_forkserver()
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout, sys.stderr = _stream(1, unbuffered), _stream(2, unbuffered)
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.argv = [TRAINER_MODULE]
    from disttrain_trainer.__main__ import main  # noqa: PLC0415 - imported by the forkserver already

    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


class ForkedRank:
    """A forked rank as the launcher sees a subprocess.Popen: pid, poll, wait."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        assert process.pid is not None
        self.pid: int = process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired([TRAINER_MODULE], timeout or 0.0)
        return code


class RankForker:
    """The launcher's forkserver, started now: it imports PRELOAD once while the launcher goes on,
    with OMP_NUM_THREADS = `threads` (the ranks' own; a rank given another count is exec'd); its own
    output (an import that failed) goes to `log`. Create it before the launcher starts a thread: the
    forkserver and multiprocessing's resource tracker inherit the environment, stdout and stderr as
    they start, pointed at `log` for that moment, so that neither holds the launcher's own (a caller
    reading the launcher's output to its end would wait for them too: the forkserver ends seconds
    after the launcher, torch's teardown)."""

    def __init__(self, log: Path, threads: int) -> None:
        global _server_env  # noqa: PLW0603 - one forkserver per process, as multiprocessing keeps it
        self._context: multiprocessing.context.BaseContext | None = None
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([__name__, *PRELOAD])
        from multiprocessing import forkserver  # noqa: PLC0415 - with the context above

        log.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        saved = (os.dup(1), os.dup(2))
        launcher_threads = os.environ.get(THREADS_ENV)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.environ[THREADS_ENV] = str(threads)
            if _server_env is None:  # the server this process started first, whatever a later call asks
                _server_env = dict(os.environ)
            forkserver.ensure_running()
        finally:
            if launcher_threads is None:
                del os.environ[THREADS_ENV]
            else:
                os.environ[THREADS_ENV] = launcher_threads
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (out, *saved):
                os.close(fd)

    def start(self, command: Sequence[str], env: Mapping[str, str], cwd: Path | None, log: Path,
              setup: Callable[[], None]) -> ForkedRank | None:  # fmt: skip
        """The rank forked, or None where it must be exec'd (`forkable`)."""
        if self._context is None or _server_env is None or not forkable(command, env, _server_env):
            return None
        process = self._context.Process(target=_rank_main, args=(dict(env), str(cwd) if cwd else None, str(log), setup),
                                        name=f"disttrain-rank-{env.get(C.ENV_RANK, '?')}")  # fmt: skip
        try:
            process.start()
        except OSError as e:  # the forkserver died (its log says why): exec this rank and the rest
            print(f"disttrain local: cannot fork a rank ({e}); starting ranks with exec", file=sys.stderr, flush=True)
            self._context = None
            return None
        return ForkedRank(process)
