"""Leader election on a coordination.k8s.io/v1 Lease, so that a Deployment may run a standby
replica: only the holder of the Lease runs the operator; the others wait, and one takes
over within `duration_s` (+ one retry period) of the holder's last renewal.

As client-go's leaderelection (tools/leaderelection): a candidate never compares the Lease's
renewTime with its own clock (clocks of nodes differ); it notes when *it* last saw the
record change — the time its read *returned*, so a slow read never backdates it — and takes
the Lease over only after it has stayed unchanged for `duration_s` by its own monotonic
clock. Every write carries the resourceVersion that was read, so of two candidates racing
for an expired Lease exactly one wins (the other gets 409). The timing rules are client-go's
too (duration > renew deadline > 1.2 x retry period).

Why two operators never act at once (the numbers are LeaseConfig's defaults):
- a holder's renewal that succeeded was *sent* at `renewed_at`; the server wrote it no
  earlier, so no candidate sees the record unchanged for `duration_s` (8 s) before
  `renewed_at + duration_s`;
- a watchdog thread, armed from `renewed_at`, ends the process at `renewed_at +
  renew_deadline_s` (5 s) whatever any other thread is doing: a renewal blocked on a
  half-open connection, a reconcile mid-write. Taken from client-go: giving up on a
  deadline the blocked call does not wait for (its renew loop selects on a context
  timeout), then ending the process (kube-controller-manager's OnStoppedLeading is
  `klog.Fatalf("leaderelection lost")`); a Python thread blocked in a socket read cannot be
  cancelled, and only the process's end also stops the reconcile threads' writes.
  Different: client-go starts that deadline with each renew round, up to a retry period
  after the last success, and dates a success from its reply; here the deadline runs from
  when the last successful renewal was sent, which is all a late reply proves;
- every request on the lease path times out at that deadline and is never retried, so a
  renewal that would land after the watchdog fired is never attempted;
- `EXIT_GRACE_S` (the watchdog's wait for its log line) + renew_deadline_s < duration_s,
  checked when the config is built: 3 s to spare by default.
Not covered (as in client-go, which offers no fencing either): a write already sent may still
reach the API server after the process is gone, e.g. out of a stalled connection. Status
writes carry the resourceVersion they were computed from, so such a write is refused once
the new holder has written.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from urllib3.exceptions import HTTPError

from .kube import Kube, KubeError

log = logging.getLogger("disttrain.operator")

# client-go's JitterFactor: the renew deadline leaves room for more than one retry.
JITTER = 1.2
# How long the watchdog waits for its log line before stopping anyway (a handler blocked on a
# full stderr pipe must not keep a leader past its lease).
EXIT_GRACE_S = 0.5


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    namespace: str
    name: str = "disttrain-operator"
    identity: str
    # A standby takes over at most duration_s + retry_s after the holder's last renewal.
    duration_s: float = 8.0
    renew_deadline_s: float = 5.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_s > 0:
            raise ValueError(f"lease retry_s must be > 0, got {self.retry_s}")
        if not self.renew_deadline_s > JITTER * self.retry_s:
            raise ValueError(f"lease renew_deadline_s ({self.renew_deadline_s}) must exceed {JITTER} x retry_s "
                             f"({self.retry_s}): raise renew_deadline_s or lower retry_s")
        if not self.renew_deadline_s + EXIT_GRACE_S < self.duration_s:
            raise ValueError(f"lease duration_s ({self.duration_s}) must exceed renew_deadline_s "
                             f"({self.renew_deadline_s}) + {EXIT_GRACE_S}: a holder that cannot renew must be "
                             "gone before a standby may take over")


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _micro_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Seen:
    """The Lease record as last seen, and when (this process's monotonic clock)."""

    record: tuple[str, str]  # (holderIdentity, renewTime)
    at: float


def may_take(spec: dict[str, Any], me: str, seen: Seen | None, now: float, duration_s: float) -> tuple[bool, Seen]:
    """Whether `me` may write itself into a Lease with this spec now, and the updated
    observation. Pure: the whole election rule."""
    record = (spec.get("holderIdentity") or "", spec.get("renewTime") or "")
    if seen is None or seen.record != record:
        seen = Seen(record, now)
    holder = record[0]
    if not holder or holder == me:
        return True, seen
    return now - seen.at >= duration_s, seen


def lease_spec(old: dict[str, Any], me: str, cfg: LeaseConfig, now: datetime) -> dict[str, Any]:
    """The spec that makes `me` the holder (a renewal when it already is)."""
    stamp = _micro_time(now)
    renewal = old.get("holderIdentity") == me
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": int(cfg.duration_s),
        "acquireTime": old.get("acquireTime") if renewal and old.get("acquireTime") else stamp,
        "renewTime": stamp,
        "leaseTransitions": int(old.get("leaseTransitions") or 0) + (0 if renewal or not old.get("holderIdentity") else 1),
    }


class Watchdog:
    """Calls `fire` once, from its own thread, when the deadline (monotonic) passes without
    being extended: nothing another thread blocks on can delay it."""

    def __init__(self, deadline: float, fire: Callable[[], None]) -> None:
        self._deadline, self._fire = deadline, fire
        self._lock = threading.Lock()
        self.fired = False
        self.thread = threading.Thread(target=self._run, name="lease-watchdog", daemon=True)
        self.thread.start()

    def extend(self, deadline: float) -> bool:
        """Move the deadline later; False once fired (a late success changes nothing)."""
        with self._lock:
            if self.fired:
                return False
            self._deadline = max(self._deadline, deadline)
            return True

    def _run(self) -> None:
        while True:
            with self._lock:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    self.fired = True
                    break
            time.sleep(left)  # the deadline only moves later: an extension is seen on waking
        self._fire()


class Elector:
    def __init__(self, kube: Kube, cfg: LeaseConfig) -> None:
        self.kube, self.cfg = kube, cfg
        self._seen: Seen | None = None
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(cfg.namespace)}/leases"
        # When the last successful acquire/renew attempt sent its first request (monotonic).
        self.renewed_at = float("-inf")

    def _request(self, method: str, path: str, deadline: float, **kw: Any) -> tuple[int, dict[str, Any]]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("renew deadline passed")
        # No retries: urllib3's default would resend a timed-out GET/PUT three more times.
        return self.kube.request(method, path, resource="leases", timeout_s=left, retries=False, **kw)

    def try_acquire_or_renew(self, deadline: float | None = None) -> bool:
        """One attempt; every request times out at `deadline` (monotonic; default: one renew
        deadline from now). On success `renewed_at` is the time the attempt began."""
        cfg, sent = self.cfg, time.monotonic()
        deadline = sent + cfg.renew_deadline_s if deadline is None else deadline
        named = f"{self._path}/{quote(cfg.name)}"
        status, lease = self._request("GET", named, deadline, verb="get", allow=(404,))
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": lease_spec({}, cfg.identity, cfg, datetime.now(UTC))}
            status, _ = self._request("POST", self._path, deadline, verb="create", body=body, allow=(409,))
        else:
            spec = lease.get("spec") or {}
            # Observed when the read returned, not when it was sent (client-go does the same).
            ok, self._seen = may_take(spec, cfg.identity, self._seen, time.monotonic(), cfg.duration_s)
            if not ok:
                return False
            lease["spec"] = lease_spec(spec, cfg.identity, cfg, datetime.now(UTC))
            # The resourceVersion read above travels in metadata: a concurrent writer makes this 409.
            status, _ = self._request("PUT", named, deadline, verb="update", body=lease, allow=(409,))
        if status == 409:
            return False
        self.renewed_at = sent
        return True

    def _attempt(self, deadline: float | None = None) -> bool:
        try:
            return self.try_acquire_or_renew(deadline)
        except (KubeError, OSError, HTTPError) as err:
            log.warning("lease %s/%s: %s", self.cfg.namespace, self.cfg.name, err)
            return False

    def acquire(self) -> None:
        """Block until this process holds the Lease."""
        log.info("waiting to hold lease %s/%s as %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)
        while not self._attempt():
            time.sleep(self.cfg.retry_s)
        log.info("holding lease %s/%s as %s: active", self.cfg.namespace, self.cfg.name, self.cfg.identity)

    def keep(self, lost: Callable[[], None]) -> Watchdog:
        """After acquire(): renew every retry period in a daemon thread, and arm the watchdog
        that calls `lost` (which must end the process) renew_deadline_s after the last
        successful renewal was sent — before a standby may take over, even while a renewal
        is still blocked."""
        cfg = self.cfg
        assert self.renewed_at > float("-inf"), "acquire() first"
        watchdog = Watchdog(self.renewed_at + cfg.renew_deadline_s, lambda: self._give_up(lost))

        def run() -> None:
            started = self.renewed_at
            while True:
                time.sleep(max(0.0, started + cfg.retry_s - time.monotonic()))
                started, deadline = time.monotonic(), self.renewed_at + cfg.renew_deadline_s
                if watchdog.fired or started >= deadline:
                    return  # out of time: the watchdog stops the process
                if self._attempt(deadline):
                    watchdog.extend(self.renewed_at + cfg.renew_deadline_s)

        threading.Thread(target=run, name="lease-renewal", daemon=True).start()
        return watchdog

    def _give_up(self, lost: Callable[[], None]) -> None:
        said = threading.Event()

        def say() -> None:
            log.error("lease %s/%s not renewed within %.1fs of the last renewal: stopping before a standby may "
                      "take over", self.cfg.namespace, self.cfg.name, self.cfg.renew_deadline_s)
            said.set()

        threading.Thread(target=say, name="lease-lost-log", daemon=True).start()
        said.wait(EXIT_GRACE_S)
        lost()


def serve_standby_health(url: str) -> http.server.ThreadingHTTPServer:
    """Answer the liveness endpoint (kopf's, once active) while standing by: a standby is
    healthy, and its Deployment must not restart it for waiting. Shut it down before kopf
    binds the same address."""
    parts = urlsplit(url)
    path = parts.path or "/"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.dumps({"standby": True}).encode()
            self.send_response(200 if self.path == path else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a line
            pass

    server = http.server.ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), Handler)  # noqa: S104
    threading.Thread(target=server.serve_forever, name="standby-health", daemon=True).start()
    return server
