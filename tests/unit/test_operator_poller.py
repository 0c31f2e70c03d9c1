"""The periodic reconcile that replaces kopf timers (which need a finalizer on every job)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from disttrain_operator.observe import format_time
from disttrain_operator.poller import JobRegistry, Poller

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def body(phase: str | None = None, **status: object) -> dict[str, object]:
    st = {"phase": phase, "observedGeneration": 1, **status} if phase else {}
    return {"metadata": {"generation": 1, "name": "ignored"}, "spec": {"mode": "data"}, "status": st}


def test_registry_keeps_what_the_poll_decision_needs_and_forgets_deleted_jobs() -> None:
    jobs = JobRegistry()
    jobs.seen("ns", "new", body())
    jobs.seen("ns", "running", body("Running"))
    done = format_time(NOW - timedelta(minutes=5))
    jobs.seen("ns", "done", body("Succeeded", completionTime=done))
    jobs.seen("ns", "ttl", {**body("Succeeded", completionTime=done), "spec": {"runPolicy": {"ttlSecondsAfterFinished": 900}}})
    assert jobs.due(NOW, 3) == [("ns", "new"), ("ns", "running"), ("ns", "ttl")]
    jobs.seen("ns", "running", body("Succeeded", completionTime=done))  # a later watch event wins
    jobs.gone("ns", "ttl")
    assert jobs.due(NOW, 3) == [("ns", "new")] and len(jobs) == 3


def test_poller_reconciles_due_jobs_every_interval_and_survives_errors() -> None:
    jobs = JobRegistry()
    jobs.seen("ns", "a", body("Running"))
    jobs.seen("ns", "b", body("Running"))
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()

    def reconcile(ns: str, name: str) -> None:
        with lock:
            calls.append((ns, name))
        if name == "b":
            raise RuntimeError("API server unreachable")  # logged; the loop goes on

    async def main() -> float:
        poller = Poller(jobs, reconcile, interval_s=0.2)
        with pytest.raises(RuntimeError, match="not running"):
            poller.check()
        with ThreadPoolExecutor(max_workers=4) as pool:
            poller.start(pool)
            deadline = time.monotonic() + 10
            while calls.count(("ns", "a")) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            age = poller.check()
            assert poller.task is not None
            poller.task.cancel()
            return age

    start = time.monotonic()
    age = asyncio.run(main())
    took = time.monotonic() - start
    rounds_a, rounds_b = calls.count(("ns", "a")), calls.count(("ns", "b"))
    assert rounds_a >= 3 and abs(rounds_b - rounds_a) <= 1  # b's errors did not stop the rounds
    assert took >= 0.4  # rounds are paced by the interval, not back to back
    assert age < 5


def test_poller_check_fails_when_rounds_stop() -> None:
    async def main() -> None:
        poller = Poller(JobRegistry(), lambda ns, name: None, interval_s=0.1)
        with ThreadPoolExecutor(max_workers=1) as pool:
            poller.start(pool)
            await asyncio.sleep(0.05)
            poller.last_round -= 120  # no round finished for two minutes: a hung loop
            with pytest.raises(RuntimeError, match="has not finished a round"):
                poller.check()
            assert poller.task is not None
            poller.task.cancel()

    asyncio.run(main())
