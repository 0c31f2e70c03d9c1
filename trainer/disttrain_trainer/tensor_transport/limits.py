"""What one gRPC service of the transport accepts, stated in one place and enforced.

- message size: gRPC refuses a message above `max_message_bytes` (both directions);
- stream bytes: a request stream (an update, a gradient) longer than `max_stream_bytes` in all,
  or of more messages than that many bytes fill in full chunks, is cut off (RESOURCE_EXHAUSTED),
  whatever its header declared;
- concurrent streams: `max_concurrent_streams` per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)
  and `max_concurrent_rpcs` over all connections (gRPC answers RESOURCE_EXHAUSTED beyond it);
- per identity: at most `max_calls_in_flight` calls at once, and a token bucket of `calls_per_s`
  with `burst` (RESOURCE_EXHAUSTED, counted, beyond either).

Identities are only counted once authenticated, so nobody can spend another's allowance.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .codec import CHUNK_BYTES

# A chunk plus its header; headers of huge models (many tensors) stay far below this.
MAX_MESSAGE_BYTES = CHUNK_BYTES + (16 << 20)
RATE_LIMITED = "rate_limited"  # rejection reasons (counter labels)
BUSY = "too_many_calls"
STREAM_TOO_LARGE = "stream_too_large"


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_stream_bytes: int
    max_concurrent_streams: int
    max_concurrent_rpcs: int
    max_calls_in_flight: int
    calls_per_s: float
    burst: int

    @property
    def max_stream_messages(self) -> int:
        """Senders fill every chunk but the last: a stream of tiny messages is not an update."""
        return self.max_stream_bytes // CHUNK_BYTES + 2

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
        ]

    def describe(self) -> str:
        return (f"max message {self.max_message_bytes} B, max request stream {self.max_stream_bytes} B, "
                f"{self.max_concurrent_streams} streams per connection, {self.max_concurrent_rpcs} calls in all, "
                f"per identity {self.max_calls_in_flight} calls at once and {self.calls_per_s:g} calls/s "
                f"(burst {self.burst})")  # fmt: skip


def federated_limits(*, clients: int, update_bytes: int) -> Limits:
    """A client id makes at most six calls per round (the task, four secure stages, its update),
    one at a time; a round of a tiny model, with the aggregator's evaluation and checkpoint, takes
    20 ms at the very least (measured: 300 rounds of a 32-unit MLP on digits, 4 clients), so 500
    calls/s binds only a client that floods. Clients back off and retry when refused (their
    channel retries unary calls, see channel.OPTIONS)."""
    return Limits(
        max_stream_bytes=update_bytes + MAX_MESSAGE_BYTES,
        # One connection per client process, which may host every client id.
        max_concurrent_streams=2 * clients + 8,
        max_concurrent_rpcs=2 * clients + 16,
        max_calls_in_flight=4,
        calls_per_s=500.0,
        burst=1000,
    )


def paramserver_limits(*, workers: int, shard_bytes: int) -> Limits:
    """A worker makes one call at a time per shard: a pull and a push per iteration (a few hundred
    a second for a small model; a blocking Python gRPC call takes a few hundred microseconds at
    best), plus polls every 0.2 s once its steps are done."""
    return Limits(
        max_stream_bytes=shard_bytes + MAX_MESSAGE_BYTES,
        max_concurrent_streams=16,
        max_concurrent_rpcs=2 * workers + 4,
        max_calls_in_flight=4,
        calls_per_s=5000.0,
        burst=5000,
    )


class Admission:
    """Per-identity token buckets and in-flight counts; safe from any thread."""

    def __init__(self, limits: Limits, clock=time.monotonic):  # noqa: ANN001 - a () -> float
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # identity -> (tokens, at)
        self._in_flight: dict[str, int] = {}

    def enter(self, identity: str) -> str | None:
        """None when the call may go on (then `leave` when it ends); a rejection reason otherwise."""
        lim = self.limits
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(identity, (float(lim.burst), now))
            tokens = min(float(lim.burst), tokens + (now - at) * lim.calls_per_s)
            if tokens < 1.0:
                self._buckets[identity] = (tokens, now)
                return RATE_LIMITED
            if self._in_flight.get(identity, 0) >= lim.max_calls_in_flight:
                self._buckets[identity] = (tokens, now)
                return BUSY
            self._buckets[identity] = (tokens - 1.0, now)
            self._in_flight[identity] = self._in_flight.get(identity, 0) + 1
            return None

    def in_flight(self, identity: str) -> int:
        with self._lock:
            return self._in_flight.get(identity, 0)

    def leave(self, identity: str) -> None:
        with self._lock:
            n = self._in_flight.get(identity, 0) - 1
            if n > 0:
                self._in_flight[identity] = n
            else:
                self._in_flight.pop(identity, None)
