"""A fault-tolerant replica waits for its job's lighthouse before it opens torchft's Manager: on a
busy cluster the lighthouse's pod can be ready after the workers', later than the Manager's own
connect timeout (30 s), which failed the replica and counted a restart against backoffLimit."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
from disttrain_trainer.modes.data import ft_replica
from disttrain_trainer.process.dist_env import RendezvousError
from ports import free_port  # tests/ports.py: each xdist worker's own slice
from torchft.coordination import LighthouseServer


def test_a_lighthouse_that_starts_late_is_waited_for_and_a_manager_then_connects(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    servers: list[LighthouseServer] = []

    def start_late() -> None:
        time.sleep(2.0)
        servers.append(LighthouseServer(bind=f"[::]:{port}", min_replicas=1))

    t = threading.Thread(target=start_late)
    t0 = time.monotonic()
    t.start()
    try:
        ft_replica.wait_for_lighthouse(url, timeout_s=60)
        waited = time.monotonic() - t0
        t.join()
        assert 1.9 <= waited < 30, waited
        assert f"waiting for the job's lighthouse at {url}" in capsys.readouterr().out
        # What the Manager does first: its server connects to the lighthouse, now at once.
        from torchft._torchft import ManagerServer  # noqa: PLC0415

        m = ManagerServer(replica_id="r0", lighthouse_addr=url, hostname="127.0.0.1", bind="[::]:0",
                          store_addr="127.0.0.1:1", world_size=1, heartbeat_interval=timedelta(milliseconds=100),
                          connect_timeout=timedelta(seconds=5), quorum_retries=0)  # fmt: skip
        m.shutdown()
    finally:
        t.join()
        for s in servers:
            s.shutdown()


def test_a_lighthouse_that_never_listens_fails_at_the_deadline_naming_it() -> None:
    port = free_port()  # nothing listens: every connection is refused
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match=rf"lighthouse at {url} did not accept a connection within 2s"):
        ft_replica.wait_for_lighthouse(url, timeout_s=2)
    assert 1.9 <= time.monotonic() - t0 < 6


def test_a_lighthouse_name_that_does_not_resolve_fails_at_the_deadline() -> None:
    with pytest.raises(RendezvousError, match=r"lighthouse at http://no-such-lighthouse\.invalid:29510"):
        ft_replica.wait_for_lighthouse("http://no-such-lighthouse.invalid:29510", timeout_s=1)


def test_a_lighthouse_that_accepts_but_says_nothing_counts_as_up() -> None:
    """Only the connection is awaited: what the lighthouse answers is torchft's business (its own
    timeouts), so a listener that accepts returns at once."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        t0 = time.monotonic()
        ft_replica.wait_for_lighthouse(f"http://127.0.0.1:{srv.getsockname()[1]}", timeout_s=30)
        assert time.monotonic() - t0 < 2
