"""Stopping on request: SIGTERM ends a run at a step every rank agrees on, with that step saved.

Kubernetes asks a pod to stop with SIGTERM (a suspend, a drain, an eviction, a preemption, the
operator restarting a gang) and SIGKILLs it runPolicy.terminationGracePeriodSeconds later;
`disttrain local` stops its gang the same way. The trainer is PID 1 in its container, and the
kernel drops a signal to PID 1 that has no handler: without one it would train on until the
SIGKILL and lose everything since its last periodic checkpoint.

One mechanism for every mode and role: `install()` (first thing in `python -m
disttrain_trainer` and in every spawned local rank) sets a handler that records the request
(`requested()`, `event`), runs the callbacks registered with `on_request` (a pod's spawning
parent forwards the signal to its local ranks; an asyncio server wakes its loop), and then:
- outside `deferred()`: the process leaves at once with STOPPED. That is start-up (rendezvous,
  loading data, resuming): nothing there is worth saving, and the kubelet need not wait out the
  grace period. Python runs signal handlers in the main thread only, between bytecodes, so a
  main thread blocked in C++ (a rendezvous waits minutes for a peer that is gone) would never
  see it: a watcher thread reads the signal from the interpreter's wakeup fd and exits for it.
  In Python code the handler raises StopRequested first, which `python -m disttrain_trainer`
  turns into the same exit code. Raised inside an import, it may come out as another error: a
  C extension's import turns any exception into ImportError (numpy's did, as "could not import
  module datetime"), so `python -m disttrain_trainer` also counts a failure that follows a
  raised request (`raised_before_training()`) as the stop;
- inside `deferred()` (a training loop, a server, a parent waiting for its local ranks): the
  request is only recorded. The code polls `requested()` at its step boundaries, finishes the
  step, saves, waits for the write to be durable and raises StopRequested itself. Ranks of a
  collective loop agree on the step first (StopAgreement, or a flag in a collective the loop
  makes anyway), so all of them save the same step.

`python -m disttrain_trainer` turns StopRequested into exit code exitcodes.STOPPED, which the
operator and the launcher count as a disruption, not a failure. If the step or the write does
not finish within the grace period, the SIGKILL ends the process: the write is atomic (temp dir,
fsync, rename), so the previous checkpoint is what the next gang resumes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from disttrain_api import exitcodes

SIGNALS = (signal.SIGTERM,)

event = threading.Event()  # set once a stop was requested; threads may wait on it
_callbacks: list[Callable[[], None]] = []
_deferred = 0
_raised = False  # the handler raised StopRequested into the main thread (outside `deferred()`)
_installed = False
_watcher: tuple[threading.Thread, int] | None = None  # the watcher thread, the wakeup pipe's write end
_previous_handlers: dict[int, Any] = {}
_lock = threading.Lock()  # the handler and the watcher thread may both report one signal


class StopRequested(BaseException):  # noqa: N818 - a request, like KeyboardInterrupt, not an error
    """The process stops on request; `python -m disttrain_trainer` exits exitcodes.STOPPED.

    A BaseException, so that `except Exception` on the way up (a retry loop, a cleanup) lets it pass."""


def install() -> None:
    """Handle SIGTERM in this process (main thread only; idempotent)."""
    global _installed, _watcher
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        _previous_handlers[sig] = signal.signal(sig, _on_signal)
    _installed = True
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)  # the C handler writes each signal number
    watcher = threading.Thread(target=_watch, args=(read_fd,), name="sigterm-watch", daemon=True)
    watcher.start()
    _watcher = (watcher, write_fd)


def uninstall() -> None:
    """Undo `install()` and forget any request (tests that run several trainers in one process).

    The watcher thread reads every signal number already written to the wakeup pipe before the
    request is forgotten: a byte it read only after `reset()` would look like a new SIGTERM outside
    a loop and end the process for a signal that was already handled."""
    global _installed, _watcher
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("stop_request.uninstall() must run in the main thread")
    if _installed:
        signal.set_wakeup_fd(-1)  # no new bytes; signal.signal below runs any pending Python handler
        for sig, previous in _previous_handlers.items():
            signal.signal(sig, previous)
        _previous_handlers.clear()
        _installed = False
    if _watcher is not None:
        watcher, write_fd = _watcher
        _watcher = None
        os.close(write_fd)  # the watcher reads what is left, then end of file, and returns
        watcher.join()
    reset()


def _watch(read_fd: int) -> None:
    """A SIGTERM while the main thread is blocked in C++ during start-up: leave at once."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            os.close(read_fd)
            return
        if any(b in data for b in SIGNALS):
            with _lock:
                # The main thread's handler ran first (deferred: recorded; else it raised
                # StopRequested): the signal is handled. Deciding from `_deferred` now, maybe after
                # the main thread left a deferred section on that very request, would end a
                # process that is saving or has finished.
                handled = event.is_set()
            if handled:
                continue
            request()
            if not _deferred:
                _say(b"disttrain-trainer: stopped on request before training started\n")
                os._exit(exitcodes.STOPPED)


def _on_signal(signum: int, frame: Any) -> None:
    global _raised
    # Only a signal this handler records first stops the code here. The watcher thread may have
    # recorded this very signal already (it reads the wakeup byte while the main thread waits in
    # C), and the code that it woke has since left its deferred section, saving or finished:
    # raising now would turn a stop that was handled into exit 3.
    if request() and not _deferred:
        _raised = True
        raise StopRequested(f"{signal.Signals(signum).name} before training started")


def request() -> bool:
    """Record a stop request (what the signal handler does; also for in-process tests). False when
    one was recorded already."""
    with _lock:
        if event.is_set():
            return False
        event.set()
    _say(b"disttrain-trainer: stop requested (SIGTERM)\n")
    for callback in list(_callbacks):
        callback()
    return True


def _say(line: bytes) -> None:
    # os.write, not print: the handler may interrupt a print, and a buffered stream is not reentrant.
    with contextlib.suppress(OSError, ValueError):
        os.write(sys.stderr.fileno(), line)


def requested() -> bool:
    return event.is_set()


def raised_before_training() -> bool:
    """Whether the handler raised StopRequested into start-up code: whatever error that code then
    ended with (an import may have turned the stop into an ImportError) is the stop's doing."""
    return _raised


def on_request(callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` (from the signal handler, in the main thread) when a stop is requested,
    at once if one was already; returns the function that unregisters it."""
    _callbacks.append(callback)
    if event.is_set():
        callback()

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _callbacks.remove(callback)

    return remove


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """While inside, SIGTERM only records the request: the code polls `requested()` and stops
    at a step boundary with its state saved."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1


def reset() -> None:
    """Forget a request (tests that run several trainers in one process)."""
    global _raised
    event.clear()
    _raised = False


async def run_until_requested(awaitable: Any) -> bool:
    """Await `awaitable` on the running event loop; cancel it when a stop is requested.
    Returns True when it was stopped, False when it finished (its exception, if any, is raised)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    remove = on_request(lambda: loop.call_soon_threadsafe(stop.set))
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        remove()
        waiter.cancel()
    if task.done():
        task.result()
        return False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return True
