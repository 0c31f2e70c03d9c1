"""Forecasts on the documents running jobs publish, each computed once (progress.py).

Rank 0 republishes its forecast inputs once per log interval, and the scrape reads them
every poll interval: the same bytes must be forecast once, however often they are read.
The documents come from pods that run the user's code, each up to
progress.MAX_INPUT_BYTES: a cache keyed by the documents themselves would hold up to
entries x 256 KiB that any job can fill with distinct documents. So the key is a digest
of the document (the body is never kept) and the cache is bounded by what it holds in
bytes (digest, forecast and bookkeeping, accounted per entry) as well as in entries; the
least recently used entries go first.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Generic, TypeVar

V = TypeVar("V")

MAX_ENTRIES = 1024
MAX_BYTES = 1 << 20
# Per entry besides the key's and the value's own bytes: the ordered dict's slot and links.
ENTRY_OVERHEAD = 200


def accounted_size(value: object) -> int:
    """Bytes a cached value holds: the object, and for a dataclass its fields' objects."""
    if value is None:
        return 0
    size = sys.getsizeof(value)
    if is_dataclass(value):
        size += sum(sys.getsizeof(getattr(value, f.name)) for f in fields(value))
    return size


class ForecastCache(Generic[V]):
    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[bytes, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()  # scrapes run in several threads

    def get(self, body: bytes, compute: Callable[[bytes], V]) -> V:
        """compute(body), from the cache when the same bytes were computed lately."""
        key = hashlib.sha256(body).digest()
        with self._guard:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit[0]
        value = compute(body)  # outside the lock: a forecast takes milliseconds
        cost = sys.getsizeof(key) + accounted_size(value) + ENTRY_OVERHEAD
        with self._guard:
            if key not in self._entries and cost <= self.max_bytes:
                self._entries[key] = (value, cost)
                self._bytes += cost
                while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self._bytes -= dropped
        return value

    @property
    def bytes(self) -> int:
        """The bytes accounted to what the cache holds now."""
        with self._guard:
            return self._bytes

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)
