"""Read training progress from rank 0's Prometheus endpoint (pod IP : metrics port).

The pod is the job's and runs the user's code: the scrape trusts nothing it sends.
One HTTP/1.0 GET over a plain socket (so the server ends the body by closing, with
no chunked encoding to follow), every read bounded by what is left of one total
deadline (bytes trickling in one at a time cannot stretch it), at most MAX_BYTES
read (an endless body is cut off), and any answer but 200 is no reading (a
redirect is never followed). One scrape thread is held at most `timeout_s`.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from disttrain_api import metric_names as names
from disttrain_api.metric_names import PROGRESS_SERIES as SERIES
from disttrain_api.scaling.hint import HINT_CLEAR_FRACTION, Proposal, propose

from .forecast_cache import ForecastCache
from .observe import parse_prometheus

# A reading's key for the forecast on rank 0's published inputs (a Proposal, or None when they
# do not fit the model); absent when they were not read (below the hint's clear threshold, or
# not served yet): the hint then stays as it is.
FORECAST = "forecast"
# Forecast inputs are a few kB (a summary's scaling block).
MAX_INPUT_BYTES = 256 << 10

# A rank's page is tens of kB; a federated aggregator with thousands of clients a few MB.
MAX_BYTES = 4 << 20
HEAD_BYTES = 16 << 10  # status line and headers
READ_BYTES = 64 << 10


def _request(ip: str, port: int, path: str) -> bytes:
    host = f"[{ip}]" if ":" in ip else ip
    return f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n".encode()


def _receive(ip: str, port: int, path: str, deadline: float, limit: int) -> bytes | None:
    """Everything the server sends until it closes; None past the deadline or `limit` bytes."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    with socket.create_connection((ip, port), timeout=remaining) as sock:
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        sock.sendall(_request(ip, port, path))
        got = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            sock.settimeout(remaining)
            piece = sock.recv(min(READ_BYTES, limit + 1 - len(got)))
            if not piece:
                return bytes(got)
            got += piece
            if len(got) > limit:
                return None


def read_bounded(ip: str, port: int, *, timeout_s: float, max_bytes: int = MAX_BYTES,
                 path: str = "/metrics") -> bytes | None:  # fmt: skip
    """The body of a 200 answer to GET `path`, or None: no full answer within `timeout_s` in all,
    another status (a redirect included), or a body over `max_bytes`."""
    try:
        raw = _receive(ip, port, path, time.monotonic() + timeout_s, max_bytes + HEAD_BYTES)
    except OSError:
        return None
    if raw is None:
        return None
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    status, *headers = head.split(b"\r\n")
    parts = status.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or parts[1] != b"200":
        return None
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in headers)}
    if fields.get(b"transfer-encoding", b"identity").lower() != b"identity":
        return None  # not allowed in an answer to HTTP/1.0
    length = fields.get(b"content-length")
    if length is not None:
        if not length.isdigit() or len(body) < int(length):
            return None  # cut short
        body = body[: int(length)]
    return body if len(body) <= max_bytes else None


# Forecasts by a digest of the document: bounded in entries and bytes, never the bodies.
FORECASTS: ForecastCache[Proposal | None] = ForecastCache()


def _forecast(body: bytes) -> Proposal | None:
    try:
        inputs = json.loads(body)
    except ValueError:
        return None
    return propose(inputs)


def _proposal(body: bytes) -> Proposal | None:
    """The forecast on one published document (rank 0 republishes once per log interval: the
    same bytes are forecast once, however many scrapes read them)."""
    return FORECASTS.get(body, _forecast)


def scrape(ip: str, port: int, timeout_s: float = 1.5) -> dict[str, Any] | None:
    """PROGRESS_SERIES by name, or None when unreachable (e.g. the operator runs outside a
    cluster whose pod network it cannot route to). While the exposed-communication fraction is
    at or above the hint's clear threshold, also FORECAST: the forecast on the inputs rank 0
    publishes (metric_names.FORECAST_INPUTS_PATH), when it serves them."""
    if not ip:
        return None
    body = read_bounded(ip, port, timeout_s=timeout_s)
    if body is None:
        return None
    found: dict[str, Any] = parse_prometheus(body.decode("utf-8", "replace"), SERIES)
    exposed = found.get(names.COMM_EXPOSED_FRACTION)
    if exposed is not None and exposed >= HINT_CLEAR_FRACTION:
        doc = read_bounded(ip, port, timeout_s=timeout_s, max_bytes=MAX_INPUT_BYTES, path=names.FORECAST_INPUTS_PATH)
        if doc is not None and doc.lstrip().startswith(b"{"):  # not published yet: the server answers metrics
            found[FORECAST] = _proposal(doc)
    return found or None
