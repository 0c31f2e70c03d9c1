"""Training progress of running jobs, read from their rank 0's metrics endpoint off the
reconcile path: the trainer never talks to the API, so the operator asks it.

A reconcile names the endpoint of a running job (`target`) and reads the last reading
(`latest`); it never waits for a scrape. One loop scrapes each target at most once per
interval, with at most `concurrency` scrapes in flight over all jobs, and calls
`changed(key)` when a reading differs from the previous one (that reconcile writes it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("disttrain.operator")
Scrape = Callable[[str, int], dict[str, Any] | None]


@dataclass(frozen=True)
class Endpoint:
    ip: str
    port: int


class ProgressScraper:
    def __init__(self, scrape: Scrape, changed: Callable[[Hashable], None], *, interval_s: float,
                 concurrency: int = 4) -> None:
        self.scrape, self.changed = scrape, changed
        self.interval_s, self.concurrency = interval_s, concurrency
        self._targets: dict[Hashable, Endpoint] = {}
        self._readings: dict[Hashable, dict[str, Any]] = {}
        # When each reading was taken (wall clock): a job's progress rate is measured between
        # readings, not between the reconciles that happen to read them.
        self._taken_at: dict[Hashable, float] = {}
        self._guard = threading.Lock()  # targets are set from reconcile threads
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="scrape")
        self.task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ reconcile side (any thread)
    def target(self, key: Hashable, endpoint: Endpoint | None) -> None:
        """Scrape `endpoint` for `key` from now on; None: stop (the job is not running)."""
        with self._guard:
            if endpoint is None:
                self._targets.pop(key, None)
                self._readings.pop(key, None)
                self._taken_at.pop(key, None)
            elif self._targets.get(key) != endpoint:
                self._targets[key] = endpoint
                self._readings.pop(key, None)  # another pod (a new attempt): old readings are not its
                self._taken_at.pop(key, None)

    def latest(self, key: Hashable) -> dict[str, Any] | None:
        with self._guard:
            return self._readings.get(key)

    def taken_at(self, key: Hashable) -> float | None:
        """When the latest reading was taken (time.time()): the first scrape that showed it."""
        with self._guard:
            return self._taken_at.get(key)

    def __len__(self) -> int:
        with self._guard:
            return len(self._targets)

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="progress-scraper")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(self.concurrency)

        async def one(key: Hashable, endpoint: Endpoint) -> None:
            async with gate:
                reading = await loop.run_in_executor(self._pool, self.scrape, endpoint.ip, endpoint.port)
            if reading is None:
                return
            with self._guard:
                if self._targets.get(key) != endpoint or self._readings.get(key) == reading:
                    return
                self._readings[key] = reading
                self._taken_at[key] = time.time()
            self.changed(key)

        while True:
            start = time.monotonic()
            with self._guard:
                targets = list(self._targets.items())
            try:
                # One round per interval, each job once: a job's rate is bounded by the interval,
                # the total by the semaphore; a slow endpoint delays the round, not a reconcile.
                await asyncio.gather(*(one(key, ep) for key, ep in targets), return_exceptions=True)
            except Exception:  # noqa: BLE001 - one bad round must not end the loop
                log.exception("progress scrape round failed")
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - start)))
