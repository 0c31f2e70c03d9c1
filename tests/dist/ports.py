"""A free TCP port for a rank's rendezvous (MASTER_PORT) or a test's server.

Picked at random below the kernel's ephemeral range and checked free: a port from the ephemeral
range (what binding port 0 gives) can be taken between this check and the rank's own bind by any
outgoing connection of the other tests running beside it (EADDRINUSE at rendezvous, seen on a
2-core CI host); one below it only by another test that drew the same number.
"""

from __future__ import annotations

import random
import socket

_DRAW = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    high = _ephemeral_low()
    for _ in range(100):
        port = _DRAW.randrange(10000, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 10000-{high}")
