"""The last known state of each job, fed by the job watch and by the operator's own writes.

A reconcile reads the job from here instead of GETting it. Its own status patch returns
the patched job, which is stored at once: the next reconcile sees it even before the watch
delivers it, so a restart is never counted twice. Watch events that arrive later but carry
an older resourceVersion do not replace a newer state.
"""

from __future__ import annotations

import threading
from typing import Any

JobKey = tuple[str, str]  # (namespace, name)


def _version(body: dict[str, Any]) -> int | None:
    # resourceVersions are opaque to clients in general; every API server (etcd3) makes them
    # increasing integers. Not one: no ordering, the newest arrival wins.
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


class JobCache:
    def __init__(self) -> None:
        self._jobs: dict[JobKey, dict[str, Any]] = {}
        self._guard = threading.Lock()

    def put(self, key: JobKey, body: dict[str, Any]) -> bool:
        """Store `body` unless a newer version of the same job is stored; True when stored
        (something may have changed), False when it was not newer."""
        meta = body.get("metadata") or {}
        if "managedFields" in meta:  # large, never read
            body = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        with self._guard:
            old = self._jobs.get(key)
            if old is not None and (old.get("metadata") or {}).get("uid") == (body.get("metadata") or {}).get("uid"):
                new_v, old_v = _version(body), _version(old)
                if new_v is not None and old_v is not None and new_v <= old_v:
                    return False
            self._jobs[key] = body
            return True

    def get(self, key: JobKey) -> dict[str, Any] | None:
        with self._guard:
            return self._jobs.get(key)

    def drop(self, key: JobKey, uid: str | None = None) -> None:
        """Forget the job (only the incarnation with `uid`, when given)."""
        with self._guard:
            old = self._jobs.get(key)
            if old is not None and (uid is None or (old.get("metadata") or {}).get("uid") == uid):
                del self._jobs[key]

    def __len__(self) -> int:
        with self._guard:
            return len(self._jobs)
