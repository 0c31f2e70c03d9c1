"""One tracking backend on its own thread behind a bounded queue: `put` never blocks the caller,
and `close` waits a bounded time.

A record the backend cannot take (it raised, after its own bounded retries), one dropped because
the queue was full (the backend stalls: a server that hangs), and one still queued when `close`
gives up, each counts as one error (`on_error`) and is logged: the first at once, later ones at
most every LOG_EVERY_S, and a total at close.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# A run logs a record per log interval and per evaluation or checkpoint: thousands at most.
QUEUE_MAX = 4096
# Records handed to the backend at once (it may send them in one request).
BATCH_MAX = 256
LOG_EVERY_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Scalars:
    step: int
    values: dict[str, float]
    wall_time: float


@dataclass(frozen=True, kw_only=True)
class Final:
    """The run's end: its summary (None when it did not finish) and the exported model's folder."""

    summary: dict[str, Any] | None
    step: int
    export_dir: str | None


Item = Scalars | Final


class Backend(Protocol):
    name: str

    def write(self, items: list[Scalars]) -> None:
        """Deliver the scalars; raise when they could not be (after the backend's own retries)."""

    def finish(self, final: Final) -> None:
        """The run's end: its summary and model where it has them; then release everything."""


class BackgroundWriter:
    def __init__(self, backend: Backend, *, on_error: Callable[[int], None], log: Callable[[str], None],
                 maxsize: int = QUEUE_MAX) -> None:  # fmt: skip
        self.backend = backend
        self.errors = 0
        self._on_error, self._log = on_error, log
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=maxsize)
        self._lock = threading.Lock()
        self._last_log = float("-inf")
        self._thread = threading.Thread(target=self._run, name=f"tracking-{backend.name}", daemon=True)
        self._thread.start()

    def put(self, item: Item) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._fail(1, "queue full (the backend is not keeping up): record dropped")

    def close(self, final: Final, timeout_s: float) -> int:
        """Hand over the end, wait up to `timeout_s` for everything queued; returns the errors counted."""
        try:
            self._queue.put(final, timeout=max(0.0, timeout_s))
        except queue.Full:
            self._fail(1, "queue full at the end: the summary was not delivered")
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            left = self._queue.qsize() + 1  # the item in hand too
            self._fail(left, f"gave up after {timeout_s:.0f} s at the end: {left} records not delivered")
        if self.errors:
            self._log(f"tracking ({self.backend.name}): {self.errors} records not delivered in all")
        return self.errors

    def _fail(self, n: int, why: str) -> None:
        with self._lock:
            self.errors += n
            now = time.monotonic()
            say = now - self._last_log >= LOG_EVERY_S
            if say:
                self._last_log = now
        self._on_error(n)
        if say:
            self._log(f"tracking ({self.backend.name}): {why}; training goes on ({self.errors} not delivered so far)")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, Final):
                self._finish(item)
                return
            batch: list[Scalars] = [item]
            final: Final | None = None
            while len(batch) < BATCH_MAX:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(more, Final):
                    final = more
                    break
                batch.append(more)
            try:
                self.backend.write(batch)
            except Exception as e:  # noqa: BLE001 - any failure of a tracking backend is counted, never raised
                self._fail(len(batch), f"{type(e).__name__}: {_first_line(e)}")
            if final is not None:
                self._finish(final)
                return

    def _finish(self, final: Final) -> None:
        try:
            self.backend.finish(final)
        except Exception as e:  # noqa: BLE001 - as above
            self._fail(1, f"at the end: {type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""
