"""What a status write sends, and whether it may wait: pure functions over status dicts, and
the per-job limit on progress-only writes."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

# Fields that only report how far a healthy job got: pod counts, training progress and the
# phase message that counts pods. A change to these alone is written at most once per
# progress interval per job; every other change (phase, conditions, attempt, restarts, ...)
# is a transition and is written at once.
PROGRESS_FIELDS = frozenset({"workers", "step", "lastCheckpointStep", "commFraction", "progress", "message"})


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) turning `old` into `new`: changed keys only, removed
    keys as null, nested objects recursively, lists whole (merge patches cannot address
    list items)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif key not in old or before != value:
            patch[key] = value
    return patch


def progress_only(patch: dict[str, Any]) -> bool:
    """Whether a status patch changes nothing but progress fields (see PROGRESS_FIELDS)."""
    return bool(patch) and set(patch) <= PROGRESS_FIELDS


class ProgressWrites:
    """When a job's progress-only change may be written: at most one such write per job per
    `interval_s`, and none until the change is `interval_s` old (a change seen at t is written
    at max(last write, t) + interval), whatever the number of readings or pod events in
    between: the write carries the latest state. Any status write (a transition carries the
    latest progress too) starts the next interval. Keys are jobs; the clock is the caller's
    (monotonic seconds)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last_write: dict[Hashable, float] = {}
        self._since: dict[Hashable, float] = {}  # when an unwritten progress change was first seen

    def wait_s(self, key: Hashable, now: float) -> float:
        """Seconds until the pending progress change of `key` may be written (<= 0: now)."""
        since = self._since.setdefault(key, now)
        return max(self._last_write.get(key, float("-inf")), since) + self.interval_s - now

    def written(self, key: Hashable, now: float) -> None:
        self._last_write[key] = now
        self._since.pop(key, None)

    def undone(self, key: Hashable) -> None:
        """The pending change went away before its write (nothing differs any more)."""
        self._since.pop(key, None)

    def forget(self, key: Hashable) -> None:
        self._last_write.pop(key, None)
        self._since.pop(key, None)
