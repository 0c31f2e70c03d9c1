"""Pods this operator created or deleted whose watch event has not arrived yet.

The pod index lags the API by a watch event: a pod just created must count as existing (or
a gang would look "vanished" right after its creation), and a pod just deleted by the
operator must not be deleted again, nor taken for a disruption by someone else.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .cache import JobKey

# How long a created pod that the watch has not shown yet still counts as existing.
EXPECT_TIMEOUT_S = 30.0


@dataclass
class Expectations:
    """Pods created or deleted by this operator whose watch event has not arrived yet, per job."""

    created: dict[JobKey, tuple[frozenset[str], float]] = field(default_factory=dict)
    deleted: dict[JobKey, dict[str, float]] = field(default_factory=dict)  # pod uid -> when
    guard: threading.Lock = field(default_factory=threading.Lock)

    def expect_created(self, key: JobKey, names: list[str], now: float) -> None:
        with self.guard:
            self.created[key] = (frozenset(names), now + EXPECT_TIMEOUT_S)

    def waiting_for(self, key: JobKey, seen: set[str], now: float) -> frozenset[str]:
        """Created pods not seen yet; empty (and forgotten) once all are seen or too late."""
        with self.guard:
            names, until = self.created.get(key, (frozenset(), 0.0))
            missing = names - seen
            if not missing or now >= until:
                self.created.pop(key, None)
                return frozenset()
            return missing

    def expect_deleted(self, key: JobKey, uids: list[str], now: float) -> None:
        with self.guard:
            mine = self.deleted.setdefault(key, {})
            for uid in uids:
                mine[uid] = now + EXPECT_TIMEOUT_S

    def already_deleted(self, key: JobKey, now: float) -> set[str]:
        with self.guard:
            mine = self.deleted.get(key, {})
            for uid in [u for u, until in mine.items() if now >= until]:
                del mine[uid]
            return set(mine)

    def forget(self, key: JobKey) -> None:
        with self.guard:
            self.created.pop(key, None)
            self.deleted.pop(key, None)
