"""A free TCP port for a rank's rendezvous (MASTER_PORT) or a test's server.

Picked at random below the kernel's ephemeral range and checked free: a port from the ephemeral
range (what binding port 0 gives) can be taken between this check and the rank's own bind by any
outgoing connection of the other tests running beside it (EADDRINUSE at rendezvous, seen on a
2-core CI host); one below it only by another test that drew the same number. So each pytest-xdist
worker draws from its own slice of that range and never hands out a port twice: the check is
seconds before the bind (a rank imports torch first), and two workers that drew the same port in
that window once put a rank of one test's gang into the other's rendezvous.
"""

from __future__ import annotations

import os
import random
import socket

LOW = 10000
_DRAW = random.SystemRandom()
_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_slice(worker: str | None, workers: str | None, high: int) -> range:
    """The ports pytest-xdist worker `worker` ("gw<N>", of `workers`) draws from; all of LOW..high
    outside xdist."""
    try:
        index, count = int((worker or "").removeprefix("gw")), int(workers or "")
    except ValueError:
        return range(LOW, high)
    width = (high - LOW) // max(count, 1)
    return range(LOW + index * width, LOW + (index + 1) * width)


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (a job's ranks serve on a base port + rank)."""
    ports = worker_slice(os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT"),
                         _ephemeral_low())  # fmt: skip
    for _ in range(100):
        base = _DRAW.randrange(ports.start, ports.stop - count + 1)
        run = range(base, base + count)
        if any(port in _given for port in run) or not all(_bindable(port) for port in run):
            continue
        _given.update(run)
        return base
    raise RuntimeError(f"no {count} consecutive free ports in {ports.start}-{ports.stop - 1}")


def free_port() -> int:
    return free_ports(1)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
