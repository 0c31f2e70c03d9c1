"""Servers run by a Deployment (the federated aggregator, parameter-server shards) stay up
after the job's last round or step until Kubernetes stops them.

A Deployment restarts a container that exits, even with status 0; the restarted server would
resume from its final checkpoint and exit again, over and over, until the operator deletes
the Deployment once the gang has finished. So, when the operator asks for it
(DISTTRAIN_SERVE_UNTIL_STOPPED), a finished server keeps answering "done" (a client pod
replaced late still hears it) and keeps its metrics endpoint up, until SIGTERM
(process/stop_request.py, the one SIGTERM handler of the trainer) or SIGINT. A finished server
stopped this way exits 0: its work is done and saved.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

from disttrain_api import constants as C

from . import stop_request


def requested(env: Mapping[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get(C.ENV_SERVE_UNTIL_STOPPED, "") not in ("", "0")


def block() -> None:
    """Block the main thread until SIGTERM or SIGINT (threaded servers keep serving)."""
    stop_request.install()
    previous = signal.signal(signal.SIGINT, lambda *_: stop_request.request())
    try:
        with stop_request.deferred():
            print("finished: serving until stopped", flush=True)
            while not stop_request.event.wait(1.0):
                pass
    finally:
        signal.signal(signal.SIGINT, previous)


async def wait() -> None:
    """The asyncio form of block(), for a server on the running loop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stop_request.install()
    remove = stop_request.on_request(lambda: loop.call_soon_threadsafe(stop.set))
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        with stop_request.deferred():
            print("finished: serving until stopped", flush=True)
            await stop.wait()
    finally:
        remove()
        loop.remove_signal_handler(signal.SIGINT)
