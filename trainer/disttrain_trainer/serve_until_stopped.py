"""Servers run by a Deployment (the federated aggregator, parameter-server shards) stay up
after the job's last round or step until Kubernetes stops them.

A Deployment restarts a container that exits, even with status 0; the restarted server would
resume from its final checkpoint and exit again, over and over, until the operator deletes
the Deployment once the gang has finished. So, when the operator asks for it
(DISTTRAIN_SERVE_UNTIL_STOPPED), a finished server keeps answering "done" (a client pod
replaced late still hears it) and keeps its metrics endpoint up, until SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Mapping

from disttrain_api import constants as C

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def requested(env: Mapping[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get(C.ENV_SERVE_UNTIL_STOPPED, "") not in ("", "0")


def block() -> None:
    """Block the main thread until SIGTERM or SIGINT (threaded servers keep serving)."""
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    print("finished: serving until stopped", flush=True)
    while not stop.wait(1.0):
        pass


async def wait() -> None:
    """The asyncio form of block(), for a server on the running loop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    print("finished: serving until stopped", flush=True)
    try:
        await stop.wait()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
