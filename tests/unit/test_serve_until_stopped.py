"""A finished server under a Deployment serves until SIGTERM, then exits 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
from disttrain_api import constants as C
from disttrain_trainer.process import serve_until_stopped, stop_request

PROGRAM = {
    "block": "from disttrain_trainer.process import serve_until_stopped as s; s.block(); print('stopped', flush=True)",
    "wait": "import asyncio; from disttrain_trainer.process import serve_until_stopped as s; "
            "asyncio.run(s.wait()); print('stopped', flush=True)",
}  # fmt: skip


def test_requested_only_when_the_operator_sets_it() -> None:
    assert not serve_until_stopped.requested({})
    assert not serve_until_stopped.requested({C.ENV_SERVE_UNTIL_STOPPED: "0"})
    assert serve_until_stopped.requested({C.ENV_SERVE_UNTIL_STOPPED: "1"})


@pytest.mark.parametrize("form", sorted(PROGRAM))
def test_blocks_until_sigterm_then_returns(form: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM[form]], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "finished: serving until stopped"
        assert proc.poll() is None  # still serving
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out.strip() == "stopped"


def test_wait_is_cancellable() -> None:
    async def main() -> None:
        task = asyncio.create_task(serve_until_stopped.wait())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        stop_request.uninstall()  # wait() installed the trainer's SIGTERM handler in this process
