"""Leader election on a Lease (standby replicas), against an in-memory Lease API."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from typing import Any

from disttrain_operator import leader
from disttrain_operator.kube import Kube
from disttrain_operator.leader import Elector, LeaseConfig, Seen, lease_spec, may_take
from kubernetes import client


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

    def request(self, method: str, path: str, *, resource: str, verb: str, query: Any = None, body: Any = None,
                content_type: str = "application/json", allow: tuple[int, ...] = ()) -> tuple[int, dict[str, Any]]:
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

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
