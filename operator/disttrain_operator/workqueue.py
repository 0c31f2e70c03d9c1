"""The reconcile queue: watch events (of a job, of its pods, a new progress reading) mark a
job dirty; worker tasks reconcile dirty jobs in a thread pool (each reconcile makes
blocking API calls).

The guarantees a controller needs, as in client-go's workqueue: a job is reconciled by at
most one worker at a time; events arriving while it is queued coalesce into one reconcile;
an event arriving while it runs queues exactly one more reconcile after it. A reconcile
may ask to run again after a delay (a deadline, a force-delete timeout); nothing polls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("disttrain.operator")

# reconcile(key, prepare(key)) returns seconds until it must run again (None: only on the
# next event). prepare runs in the event loop's thread: it snapshots what only that thread
# may read (kopf's indexes) for the reconcile thread.
Reconcile = Callable[[Hashable, Any], float | None]
Prepare = Callable[[Hashable], Any]


class WorkQueue:
    def __init__(self, reconcile: Reconcile, *, prepare: Prepare = lambda key: None, workers: int,
                 error_backoff_s: float = 5.0) -> None:
        self.reconcile, self.prepare = reconcile, prepare
        self.workers, self.error_backoff_s = workers, error_backoff_s
        self._queue: asyncio.Queue[Hashable] | None = None
        self._queued: set[Hashable] = set()  # in _queue, not yet taken
        self._running: set[Hashable] = set()
        self._dirty: set[Hashable] = set()  # marked while running: once more afterwards
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.last_beat = time.monotonic()

    def start(self, executor: concurrent.futures.Executor) -> None:
        self._queue = asyncio.Queue()
        for i in range(self.workers):
            self._tasks.append(asyncio.get_running_loop().create_task(self._work(executor), name=f"reconcile-{i}"))

    def add(self, key: Hashable) -> None:
        """Reconcile `key` as soon as a worker is free (once, however often it is added).
        Event-loop thread only."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            assert self._queue is not None, "start() first"
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Hashable, delay_s: float) -> None:
        """Reconcile `key` in `delay_s` unless an earlier add() comes first."""
        if key in self._timers or key in self._queued:
            return
        self._timers[key] = asyncio.get_running_loop().call_later(delay_s, self._fire, key)

    def forget(self, key: Hashable) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._dirty.discard(key)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

    def check(self) -> float:
        """Seconds since a worker last finished a reconcile while work was waiting (0 when idle);
        raises when the workers died or stopped making progress, so the liveness endpoint
        fails and the pod is restarted."""
        if not self._tasks or any(t.done() for t in self._tasks):
            raise RuntimeError("the reconcile workers are not running")
        if not self._queued:
            return 0.0
        age = time.monotonic() - self.last_beat
        if age > 120:
            raise RuntimeError(f"no reconcile finished for {age:.0f}s while {len(self._queued)} jobs wait")
        return round(age, 1)

    async def _work(self, executor: concurrent.futures.Executor) -> None:
        loop = asyncio.get_running_loop()
        assert self._queue is not None
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._running.add(key)
            again: float | None = None
            try:
                # A copy of this task's context: run_in_executor alone would not carry context
                # variables (kopf's settings) into the thread.
                snapshot = self.prepare(key)
                again = await loop.run_in_executor(executor, contextvars.copy_context().run, self.reconcile, key,
                                                   snapshot)
            except Exception as err:  # noqa: BLE001 - one job's failure must not stop the others
                log.error("%s: reconcile failed (retry in %.0fs): %s", key, self.error_backoff_s, err, exc_info=err)
                again = self.error_backoff_s
            finally:
                self._running.discard(key)
                self.last_beat = time.monotonic()
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            elif again is not None:
                self.add_after(key, again)
