"""What a status write sends, and whether it may wait. Pure functions over status dicts."""

from __future__ import annotations

from typing import Any

# Fields that only report how far a healthy job got: pod counts, training progress and the
# phase message that counts pods. A change to these alone is written at most once per
# progress interval per job; every other change (phase, conditions, attempt, restarts, ...)
# is a transition and is written at once.
PROGRESS_FIELDS = frozenset({"workers", "step", "lastCheckpointStep", "commFraction", "message"})


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
