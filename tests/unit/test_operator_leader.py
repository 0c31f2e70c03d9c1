"""Leader election on a Lease (standby replicas): the election rule against an in-memory
Lease API; timeouts, retries and the watchdog against a real HTTP server on 127.0.0.1 that
can stop answering."""

from __future__ import annotations

import copy
import http.server
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from disttrain_operator import leader
from disttrain_operator.kube import Kube
from disttrain_operator.leader import Elector, LeaseConfig, Seen, Watchdog, lease_spec, may_take
from kubernetes import client
from ports import free_port  # tests/ports.py: each xdist worker's own slice
from urllib3.exceptions import HTTPError


def test_a_held_lease_is_taken_only_after_it_stayed_unchanged_for_its_duration() -> None:
    held = {"holderIdentity": "a", "renewTime": "t1"}
    ok, seen = may_take(held, "b", None, now=100.0, duration_s=8)
    assert not ok and seen == Seen(("a", "t1"), 100.0)
    ok, seen = may_take(held, "b", seen, now=107.0, duration_s=8)
    assert not ok  # unchanged for 7 s of b's own clock
    ok, seen = may_take({**held, "renewTime": "t2"}, "b", seen, now=107.5, duration_s=8)
    assert not ok and seen.at == 107.5  # renewed: the wait starts again
    ok, _ = may_take({**held, "renewTime": "t2"}, "b", seen, now=115.5, duration_s=8)
    assert ok  # the holder stopped renewing
    assert may_take(held, "a", None, now=0, duration_s=8)[0]  # the holder renews
    assert may_take({"holderIdentity": ""}, "b", None, now=0, duration_s=8)[0]  # released


def test_lease_spec_counts_transitions_and_keeps_the_acquire_time_on_renewal() -> None:
    cfg = LeaseConfig(namespace="ns", identity="b")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = lease_spec({}, "b", cfg, now)
    assert first["holderIdentity"] == "b" and first["leaseTransitions"] == 0
    assert first["renewTime"] == "2026-01-01T00:00:00.000000Z" and first["leaseDurationSeconds"] == 8
    renewed = lease_spec(first, "b", cfg, now.replace(second=5))
    assert renewed["acquireTime"] == first["acquireTime"] and renewed["renewTime"].startswith("2026-01-01T00:00:05")
    taken = lease_spec({**renewed, "holderIdentity": "a"}, "b", cfg, now.replace(second=9))
    assert taken["leaseTransitions"] == 1 and taken["acquireTime"].startswith("2026-01-01T00:00:09")


class LeaseApi(Kube):
    """One Lease with optimistic concurrency, shared by several electors."""

    def __init__(self, store: dict[str, Any], lock: threading.Lock) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.store, self.lock = store, lock

    def request(self, method: str, path: str, *, resource: str, verb: str, body: Any = None,
                **_: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            lease = self.store.get("lease")
            if verb == "get":
                return (404, {}) if lease is None else (200, copy.deepcopy(lease))
            if verb == "create":
                if lease is not None:
                    return 409, {}
                self.store["lease"] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
                return 201, {}
            assert verb == "update"
            if lease is None or body["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]:
                return 409, {}
            rv = str(int(lease["metadata"]["resourceVersion"]) + 1)
            self.store["lease"] = {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}
            return 200, {}


def test_one_of_racing_candidates_wins_and_a_standby_takes_over_a_silent_holder(monkeypatch: Any) -> None:
    store: dict[str, Any] = {}
    lock = threading.Lock()
    clock = [1000.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: clock[0])
    a, b = (Elector(LeaseApi(store, lock), LeaseConfig(namespace="ns", identity=who)) for who in "ab")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert store["lease"]["spec"]["holderIdentity"] == "a"
    for _ in range(5):  # a renews every 2 s: b never takes over
        clock[0] += 2
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock[0] += 7  # a stopped (killed): b waits out the duration by its own clock...
    assert not b.try_acquire_or_renew()
    clock[0] += 2
    assert b.try_acquire_or_renew()  # ...then takes over
    assert store["lease"]["spec"]["holderIdentity"] == "b" and store["lease"]["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()  # a stale holder coming back is refused


def test_a_candidate_counts_the_lease_duration_from_when_its_read_returned(monkeypatch: Any) -> None:
    """A read that was slow must not backdate the observation: the holder may have renewed
    while it was in flight, and its renewal is valid for duration_s from when it was sent."""
    store: dict[str, Any] = {}
    lock = threading.Lock()
    clock = [1000.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: clock[0])
    a = Elector(LeaseApi(store, lock), LeaseConfig(namespace="ns", identity="a"))

    class SlowRead(LeaseApi):
        def request(self, method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
            if kw["verb"] == "get" and clock[0] == 1010.0:
                clock[0] += 2
                assert a.try_acquire_or_renew()  # a renews at 1012, while b's read is on its way
                clock[0] += 3  # b's read returns at 1015
            return super().request(method, path, **kw)

    b = Elector(SlowRead(store, lock), LeaseConfig(namespace="ns", identity="b"))
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock[0] = 1010.0
    assert not b.try_acquire_or_renew()
    clock[0] = 1018.5  # 8.5 s after b sent that read, but a's renewal holds until 1020
    assert not b.try_acquire_or_renew()
    clock[0] = 1023.1  # 8 s after b saw a's last renewal
    assert b.try_acquire_or_renew()


def test_two_candidates_updating_an_expired_lease_at_once_only_one_wins() -> None:
    store: dict[str, Any] = {"lease": {"metadata": {"name": "disttrain-operator", "resourceVersion": "7"},
                                       "spec": {"holderIdentity": ""}}}
    lock = threading.Lock()
    electors = [Elector(LeaseApi(store, lock), LeaseConfig(namespace="ns", identity=f"c{i}")) for i in range(6)]
    results: list[bool] = []
    barrier = threading.Barrier(len(electors))

    def go(e: Elector) -> None:
        barrier.wait()
        results.append(e.try_acquire_or_renew())

    threads = [threading.Thread(target=go, args=(e,)) for e in electors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1  # the others' writes carried a version already replaced
    # The winner is the holder, and nobody else thinks it holds the Lease.
    holder = store["lease"]["spec"]["holderIdentity"]
    assert [e.cfg.identity for e in electors if e.try_acquire_or_renew()] == [holder]


def test_a_standby_answers_the_liveness_endpoint_and_frees_it_for_kopf() -> None:
    import socket
    import urllib.request

    port = free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    server = leader.serve_standby_health(url)
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200 and r.read() == b'{"standby": true}'
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:  # free again for kopf's endpoint (aiohttp binds with SO_REUSEADDR too)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_lease_timings_must_let_a_holder_stop_before_anyone_may_take_over() -> None:
    cfg = LeaseConfig(namespace="ns", identity="a")
    # The watchdog fires renew_deadline_s after the last renewal was sent (+ at most its wait
    # for the log line); a standby may write only duration_s after it saw that renewal.
    assert cfg.renew_deadline_s + leader.EXIT_GRACE_S < cfg.duration_s
    assert cfg.renew_deadline_s > leader.JITTER * cfg.retry_s
    with pytest.raises(ValueError, match=r"duration_s \(5.0\) must exceed renew_deadline_s \(5.0\)"):
        LeaseConfig(namespace="ns", identity="a", duration_s=5.0)
    with pytest.raises(ValueError, match=r"renew_deadline_s \(2.0\) must exceed 1.2 x retry_s"):
        LeaseConfig(namespace="ns", identity="a", renew_deadline_s=2.0)


def test_the_watchdog_fires_at_its_deadline_once_and_a_late_extension_changes_nothing() -> None:
    fired: list[float] = []
    done = threading.Event()
    first = time.monotonic() + 0.2
    dog = Watchdog(first, lambda: (fired.append(time.monotonic()), done.set()))
    assert dog.extend(first + 0.3) and dog.extend(first)  # later wins; an earlier one is ignored
    assert done.wait(30)
    assert fired[0] >= first + 0.3
    assert not dog.extend(time.monotonic() + 60) and dog.fired
    dog.thread.join(5)
    assert fired == fired[:1]


class LeaseServer:
    """A real HTTP Lease API on 127.0.0.1 (HTTP/1.1, kept-alive connections like the API
    server's). `mode` decides how it answers: "serve" (a Lease with resourceVersions),
    "silent" (reads the request and never answers: a stalled or half-open connection),
    "trickle" (sends a reply's first bytes, then one byte every 0.2 s, never finishing: no
    read timeout ever fires), "drop" (closes the connection without an answer)."""

    def __init__(self) -> None:
        self.mode = "serve"
        self.lease: dict[str, Any] | None = None
        self.seen: list[tuple[str, str]] = []  # (mode, method) of every request received
        self.release = threading.Event()  # ends the stalls (teardown)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                mode = owner.mode
                owner.seen.append((mode, self.command))
                if mode == "silent":
                    owner.release.wait()
                    self.close_connection = True
                elif mode == "trickle":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Wait: ")
                    while not owner.release.wait(0.2):
                        self.wfile.write(b"a")
                        self.wfile.flush()
                    self.close_connection = True
                elif mode == "drop":
                    self.close_connection = True
                else:
                    self.answer(*owner.serve(self.command, body))

            def answer(self, status: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = handle_one  # noqa: N815 - the stdlib's names

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, method: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET":
            return (404, {}) if self.lease is None else (200, self.lease)
        if method == "POST":
            if self.lease is not None:
                return 409, {}
            self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
            return 201, self.lease
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            return 409, {}
        rv = str(int(self.lease["metadata"]["resourceVersion"]) + 1)
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}
        return 200, self.lease

    def kube(self) -> Kube:
        return Kube(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{self.server.server_port}")))

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def lease_server() -> Iterator[LeaseServer]:
    server = LeaseServer()
    yield server
    server.close()


@pytest.mark.parametrize("mode", ["silent", "drop"])
def test_a_lease_request_is_sent_once_and_gives_up_by_the_deadline(lease_server: LeaseServer, mode: str) -> None:
    cfg = LeaseConfig(namespace="ns", identity="a")
    elector = Elector(lease_server.kube(), cfg)
    assert elector.try_acquire_or_renew()
    lease_server.mode = mode
    started = time.monotonic()
    with pytest.raises(HTTPError):  # urllib3's own error, not MaxRetryError: no retries
        elector.try_acquire_or_renew(deadline=started + 0.3)
    assert time.monotonic() - started < cfg.renew_deadline_s
    assert lease_server.seen[2:] == [(mode, "GET")]  # acquired with GET 404 + POST; then one GET


@pytest.mark.parametrize("mode", ["silent", "trickle"])
def test_a_holder_blocked_on_its_renewal_stops_before_its_lease_can_expire(lease_server: LeaseServer,
                                                                             mode: str) -> None:
    cfg = LeaseConfig(namespace="ns", identity="a", duration_s=6.0, renew_deadline_s=2.5, retry_s=1.0)
    elector = Elector(lease_server.kube(), cfg)
    elector.acquire()
    renewed_at = elector.renewed_at
    lease_server.mode = mode  # from now on the API server never finishes an answer
    fired: list[float] = []
    done = threading.Event()
    elector.keep(lost=lambda: (fired.append(time.monotonic()), done.set()))
    assert done.wait(60), "the holder kept running with its renewal blocked"
    assert (mode, "GET") in lease_server.seen  # a renewal was in flight, never answered
    # Not before the renew deadline, and before a standby may write: duration_s after it saw
    # the last renewal, which was no earlier than when the holder sent it.
    assert renewed_at + cfg.renew_deadline_s <= fired[0] < renewed_at + cfg.duration_s
