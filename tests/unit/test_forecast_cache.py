"""The operator's cache of forecasts on the documents running jobs publish (forecast_cache.py):
each document forecast once, the cache bounded in bytes as well as entries, never holding the
documents themselves (a hostile job can publish distinct maximal ones at every scrape)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from disttrain_api.scaling.hint import propose
from disttrain_operator.forecast_cache import ForecastCache
from disttrain_operator.progress import MAX_INPUT_BYTES

INPUTS = json.loads((Path(__file__).parents[1] / "forecast_inputs.json").read_text())


def maximal(i: int) -> bytes:
    """A distinct document of the largest size the scrape reads (it starts like JSON, as the scrape wants)."""
    head = b'{"id": %d, ' % i
    return head + b"x" * (MAX_INPUT_BYTES - len(head))


def test_a_document_is_forecast_once_and_the_result_is_the_forecast() -> None:
    cache: ForecastCache[object] = ForecastCache()
    calls: list[bytes] = []

    def forecast(body: bytes) -> object:
        calls.append(body)
        return propose(json.loads(body))

    doc = json.dumps(INPUTS).encode()
    first, again = cache.get(doc, forecast), cache.get(doc, forecast)
    assert first is again and first == propose(INPUTS) and first is not None and len(calls) == 1


def test_the_cache_is_bounded_in_bytes_before_entries() -> None:
    cache: ForecastCache[object] = ForecastCache(max_entries=1024, max_bytes=64 << 10)
    for i in range(1024):
        cache.get(maximal(i), lambda body: propose(None))
    assert cache.bytes <= 64 << 10 and 0 < len(cache) < 1024  # bytes ran out first
    # The most recent documents are the ones kept.
    calls: list[int] = []
    cache.get(maximal(1023), lambda body: calls.append(1))
    cache.get(maximal(0), lambda body: calls.append(0))
    assert calls == [0]


RSS_SCRIPT = r"""
import gc, json, sys
from disttrain_operator import progress

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

N = progress.MAX_INPUT_BYTES
progress._proposal(b"{}")  # warm: imports, the first allocations
before = rss()
for i in range(1024):
    head = b'{"id": %d, ' % i
    progress._proposal(head + b"x" * (N - len(head)))
gc.collect()
print(json.dumps({"grew": rss() - before, "entries": len(progress.FORECASTS), "bytes": progress.FORECASTS.bytes,
                  "limit": progress.FORECASTS.max_bytes}))
"""


def test_operator_memory_stays_bounded_under_1024_distinct_maximal_documents() -> None:
    """What a hostile job can make the operator hold: 1024 distinct 256 KiB documents, forecast
    through the scrape's own path in a fresh interpreter; its resident memory is measured."""
    got = subprocess.run([sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert got.returncode == 0, got.stderr[-3000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["bytes"] <= out["limit"] and out["entries"] <= 1024, out
    # Keeping the documents would be 256 MiB; the forecasts of 1024 of them are well under 1 MiB.
    assert out["grew"] < 16 << 20, f"resident memory grew by {out['grew'] / 2**20:.1f} MiB: {out}"
