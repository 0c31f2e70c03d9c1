"""The periodic reconcile of every job: progress (rank 0's metrics) and recovery (failed,
vanished, unschedulable pods), which no watch event announces (the operator does not
watch pods).

Not a kopf timer: kopf blocks the deletion of every object that has a timer with its
finalizer, so a job deleted while no operator runs would hang in Terminating until
someone removed the finalizer by hand. Instead, watch events (kopf.on.event, which needs
no finalizer) keep `JobRegistry` current, and one loop reconciles the jobs that need it.
Children are cleaned up by the garbage collector through their owner references.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .decide import needs_polling

log = logging.getLogger("disttrain.operator")
JobKey = tuple[str, str]  # (namespace, name)


class JobRegistry:
    """The jobs the operator watches, each with the few fields `needs_polling` reads,
    as of the last watch event. Written from kopf's handler threads, read by the loop."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, dict[str, Any]] = {}
        self._guard = threading.Lock()

    def seen(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        brief = {
            "metadata": {"generation": meta.get("generation")},
            "spec": {"runPolicy": copy.deepcopy((body.get("spec") or {}).get("runPolicy") or {})},
            "status": copy.deepcopy(dict(body.get("status") or {})),
        }
        with self._guard:
            self._jobs[(namespace, name)] = brief

    def gone(self, namespace: str, name: str) -> None:
        with self._guard:
            self._jobs.pop((namespace, name), None)

    def due(self, now: datetime, interval_s: float) -> list[JobKey]:
        with self._guard:
            jobs = list(self._jobs.items())
        return sorted(key for key, brief in jobs if needs_polling(brief, now, interval_s))

    def __len__(self) -> int:
        with self._guard:
            return len(self._jobs)


class Poller:
    """Every `interval_s`, reconcile each due job in the executor (blocking API calls).
    One round finishes before the next starts, so slow rounds never pile up work."""

    def __init__(self, registry: JobRegistry, reconcile: Callable[[str, str], None], interval_s: float) -> None:
        self.registry, self.reconcile, self.interval_s = registry, reconcile, interval_s
        self.last_round = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    def start(self, executor: concurrent.futures.Executor) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(executor), name="disttrain-poller")

    def check(self) -> float:
        """Seconds since the last finished round; raises when the loop died or hangs, so the
        liveness endpoint fails and the pod is restarted."""
        age = time.monotonic() - self.last_round
        if self.task is None or self.task.done():
            raise RuntimeError("the periodic reconcile loop is not running")
        if age > max(60.0, 10 * self.interval_s):
            raise RuntimeError(f"the periodic reconcile loop has not finished a round for {age:.0f}s")
        return round(age, 1)

    async def _run(self, executor: concurrent.futures.Executor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = time.monotonic()
            try:
                keys = self.registry.due(datetime.now(UTC), self.interval_s)
                # Each call in a copy of this task's context (started from a kopf handler):
                # kopf.event() finds kopf's settings and event queue there; run_in_executor
                # alone would not carry context variables into the thread.
                results = await asyncio.gather(
                    *(loop.run_in_executor(executor, contextvars.copy_context().run, self.reconcile, ns, name)
                      for ns, name in keys),
                    return_exceptions=True,
                )
                for (ns, name), result in zip(keys, results, strict=True):
                    if isinstance(result, Exception):
                        log.error("%s/%s: periodic reconcile failed: %s", ns, name, result, exc_info=result)
            except Exception:  # noqa: BLE001 - one bad round must not end the loop
                log.exception("periodic reconcile round failed")
            self.last_round = time.monotonic()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - start)))
