"""Leader election on a coordination.k8s.io/v1 Lease, so that a Deployment may run a standby
replica: only the holder of the Lease runs the operator; the others wait, and one takes
over within `duration_s` (+ one retry period) of the holder's last renewal.

As client-go's leaderelection: a candidate never compares the Lease's renewTime with its
own clock (clocks of nodes differ); it notes when *it* last saw the record change, and
takes the Lease over only after it has stayed unchanged for `duration_s` by its own
monotonic clock. Every write carries the resourceVersion that was read, so of two
candidates racing for an expired Lease exactly one wins (the other gets 409).

A holder that cannot renew for `renew_deadline_s` (< duration_s, so before anyone may take
over) stops: the process exits and its Deployment restarts it as a candidate.
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

from .kube import Kube, KubeError

log = logging.getLogger("disttrain.operator")


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    namespace: str
    name: str = "disttrain-operator"
    identity: str
    # A standby takes over at most duration_s + retry_s after the holder's last renewal.
    duration_s: float = 8.0
    renew_deadline_s: float = 5.0
    retry_s: float = 2.0


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


class Elector:
    def __init__(self, kube: Kube, cfg: LeaseConfig) -> None:
        self.kube, self.cfg = kube, cfg
        self._seen: Seen | None = None
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(cfg.namespace)}/leases"

    def try_acquire_or_renew(self) -> bool:
        cfg, now = self.cfg, time.monotonic()
        status, lease = self.kube.request("GET", f"{self._path}/{quote(cfg.name)}", resource="leases", verb="get",
                                          allow=(404,))
        if status == 404:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": lease_spec({}, cfg.identity, cfg, datetime.now(UTC))}
            status, _ = self.kube.request("POST", self._path, resource="leases", verb="create", body=body,
                                          allow=(409,))
            return status != 409
        spec = lease.get("spec") or {}
        ok, self._seen = may_take(spec, cfg.identity, self._seen, now, cfg.duration_s)
        if not ok:
            return False
        lease["spec"] = lease_spec(spec, cfg.identity, cfg, datetime.now(UTC))
        # The resourceVersion read above travels in metadata: a concurrent writer makes this 409.
        status, _ = self.kube.request("PUT", f"{self._path}/{quote(cfg.name)}", resource="leases", verb="update",
                                      body=lease, allow=(409,))
        return status != 409

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except (KubeError, OSError) as err:
            log.warning("lease %s/%s: %s", self.cfg.namespace, self.cfg.name, err)
            return False

    def acquire(self) -> None:
        """Block until this process holds the Lease."""
        log.info("waiting to hold lease %s/%s as %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)
        while not self._attempt():
            time.sleep(self.cfg.retry_s)
        log.info("holding lease %s/%s as %s: active", self.cfg.namespace, self.cfg.name, self.cfg.identity)

    def keep(self, lost: Callable[[], None]) -> threading.Thread:
        """Renew every retry period in a daemon thread; call `lost` when no renewal succeeded
        for renew_deadline_s (before a standby may take over)."""

        def run() -> None:
            last_ok = time.monotonic()
            while True:
                time.sleep(self.cfg.retry_s)
                if self._attempt():
                    last_ok = time.monotonic()
                elif time.monotonic() - last_ok >= self.cfg.renew_deadline_s:
                    log.error("lease %s/%s lost: stopping", self.cfg.namespace, self.cfg.name)
                    lost()
                    return

        thread = threading.Thread(target=run, name="lease-renewal", daemon=True)
        thread.start()
        return thread


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
