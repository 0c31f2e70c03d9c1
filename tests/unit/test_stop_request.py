"""SIGTERM handling (stop_request.py) and the loop's agreement on the step to stop at (stop_agreement.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist
from disttrain_api import exitcodes
from disttrain_trainer.process import stop_request
from disttrain_trainer.process.stop_agreement import StopAgreement

# Start-up in a process of its own: SIGTERM outside a loop ends the process.
STARTUP = """
import signal, sys, time
from disttrain_trainer.process import stop_request
stop_request.install()
if sys.argv[1] == "blocked":
    # The main thread cannot run Python's handler (as when it waits in C++ for a rendezvous):
    # the signal goes to another thread, and sleep is not interrupted.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
try:
    # Inside the try: the handler raises at the next bytecode after the signal, which may still
    # be this print's once the parent has read the line.
    print("ready", flush=True)
    time.sleep(120)
except stop_request.StopRequested:
    sys.exit(3)
print("slept through it", flush=True)
"""


@pytest.fixture
def handler() -> Iterator[None]:
    """The trainer's SIGTERM handler in this process, for one test."""
    previous = signal.getsignal(signal.SIGTERM)
    stop_request.uninstall()  # a handler and watcher an earlier test left in this process
    stop_request.install()
    try:
        yield
    finally:
        stop_request.uninstall()
        # An earlier test in this process may have installed the handler and left it: uninstall
        # restored what was there before that; the rest of this process gets back what it had.
        signal.signal(signal.SIGTERM, previous)


def sigterm_and_wait() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not stop_request.requested() and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs in the main thread between bytecodes


@pytest.mark.parametrize("main_thread", ["in-python", "blocked"])
def test_before_training_sigterm_leaves_at_once(main_thread: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", STARTUP, main_thread], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)  # far less than the 120 s sleep
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exitcodes.STOPPED, out + err
    assert "stop requested (SIGTERM)" in err


# `python -m disttrain_trainer` whose mode's modules are being imported when SIGTERM comes: the
# handler raises StopRequested inside the import, and a C extension's import turns it into an
# ImportError (numpy: "PyCapsule_Import could not import module \"datetime\"").
IMPORT_STOPPED = """
import os, signal, sys, time
import disttrain_trainer.__main__ as trainer_main

def entry_for(spec):
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the kubelet's, during the import
        time.sleep(60)  # the handler raises here
    except BaseException as e:  # as a C extension's import does with any error
        raise ImportError('PyCapsule_Import could not import module "datetime"') from e

trainer_main.entry_for = entry_for
sys.exit(trainer_main.main())
"""


def test_a_sigterm_that_surfaces_as_an_import_error_still_exits_stopped(tmp_path) -> None:  # noqa: ANN001
    from disttrain_api import constants as C
    from disttrain_api.model import parse_spec, to_json

    config = tmp_path / "config.json"
    config.write_text(json.dumps(to_json(parse_spec({
        "mode": "data", "workers": {"replicas": 1}, "model": {"name": "mlp"},
        "data": {"name": "digits", "batchSize": 8}, "training": {"steps": 1}}))))  # fmt: skip
    env = {**os.environ, C.ENV_CONFIG: str(config), C.ENV_RUN_DIR: str(tmp_path / "run"),
           C.ENV_CHECKPOINT_DIR: str(tmp_path / "ck")}  # fmt: skip
    got = subprocess.run([sys.executable, "-c", IMPORT_STOPPED], env=env, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert got.returncode == exitcodes.STOPPED, got.stderr
    assert "missing dependency" in got.stderr  # what the import error said ...
    assert got.stderr.strip().splitlines()[-1] == (
        "disttrain-trainer: stopped on request (SIGTERM before training started)")  # ... and what it was


def test_a_failure_without_a_stop_request_stays_a_failure(tmp_path) -> None:  # noqa: ANN001
    from disttrain_api import constants as C

    env = {**os.environ, C.ENV_CONFIG: str(tmp_path / "missing.json")}
    got = subprocess.run([sys.executable, "-m", "disttrain_trainer"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert got.returncode == exitcodes.CONFIG, got.stderr
    assert "stopped on request" not in got.stderr


def test_inside_a_loop_sigterm_is_only_recorded_and_callbacks_run_once(handler: None) -> None:
    calls: list[str] = []
    remove = stop_request.on_request(lambda: calls.append("forwarded"))
    try:
        with stop_request.deferred():
            sigterm_and_wait()
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing
            time.sleep(0.1)
        assert stop_request.requested() and calls == ["forwarded"]
        late: list[str] = []
        stop_request.on_request(lambda: late.append("at once"))()  # registered after the request: called now
        assert late == ["at once"]
    finally:
        remove()


def test_run_until_requested_cancels_the_awaitable_on_a_request(handler: None) -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def done() -> int:
        return 1

    async def broken() -> None:
        raise ValueError("boom")

    async def main() -> tuple[bool, bool]:
        finished = await stop_request.run_until_requested(done())
        with pytest.raises(ValueError, match="boom"):
            await stop_request.run_until_requested(broken())
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        with stop_request.deferred():
            stopped = await stop_request.run_until_requested(forever())
        return finished, stopped

    assert asyncio.run(main()) == (False, True)


@pytest.fixture
def gang_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        stop_request.reset()


def test_the_loop_stops_after_the_check_that_reads_the_request(gang_of_one: None) -> None:
    stop_request.reset()
    agreement = StopAgreement(grace_s=30.0, max_every=1)  # a check after every step
    agreement.start(10)
    stopped = None
    for step in range(11, 40):
        if step == 15:
            stop_request.request()  # lands between the checks of steps 14 and 15
        if agreement.should_stop(step):
            stopped = step
            break
    # Started with the flag at step 15's check, read at step 16's: every rank stops after 16.
    assert stopped == 16


def test_checks_are_spaced_by_time_within_the_grace_period(gang_of_one: None) -> None:
    a = StopAgreement(grace_s=30.0)
    assert a.every(0.001) == 1000  # about one check per second of training
    assert a.every(0.5) == 2 and a.every(5.0) == 1  # slow steps: every step, never fewer
    assert StopAgreement(grace_s=2.0).every(0.001) == 500  # a quarter of a short grace period
    assert a.every(0.0) == a.max_every


def test_the_watcher_leaves_a_signal_the_main_thread_already_handled_alone() -> None:
    """A slow watcher thread reads the wakeup byte of a SIGTERM that the main thread's handler
    already recorded inside a deferred section, after the main thread left that section (a
    finished server, a loop that saved its step): the process must not be ended for it."""
    program = (
        "import os, signal, threading, time\n"
        "from disttrain_trainer.process import stop_request as s\n"
        "with s.deferred():\n"
        "    s.request()  # what the main thread's handler does with a SIGTERM in a deferred section\n"
        "r, w = os.pipe()\n"
        "os.write(w, bytes([signal.SIGTERM]))  # the wakeup byte the watcher reads only now\n"
        "threading.Thread(target=s._watch, args=(r,), daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "print('alive', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", (proc.returncode, proc.stderr)


def test_uninstall_lets_the_watcher_read_a_handled_signal_before_the_request_is_forgotten() -> None:
    """A loaded machine schedules the watcher thread late: a SIGTERM handled inside a deferred
    section may still sit in the wakeup pipe when a test harness forgets the request. Read after
    the reset, it would look like a new SIGTERM before training and end the process (an xdist
    worker, once)."""
    program = (
        "import os, signal\n"
        "from disttrain_trainer.process import stop_request as s\n"
        "s.install()\n"
        "with s.deferred():\n"
        "    s.request()  # what the main thread's handler does with a SIGTERM in a deferred section\n"
        "    os.write(s._watcher[1], bytes([signal.SIGTERM]))  # the byte the C handler writes\n"
        "s.uninstall()\n"
        "assert not s.requested() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
        "import time; time.sleep(0.5)\n"
        "s.install()  # installs again after an uninstall\n"
        "assert s._watcher is not None and s._watcher[0].is_alive()\n"
        "print('alive', flush=True)\n"
    )
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == "alive", (proc.returncode, proc.stderr)


def test_a_signal_the_watcher_recorded_does_not_raise_late_in_the_main_thread() -> None:
    # The main thread waits in C inside a deferred section; the watcher thread reads the wakeup
    # byte and records the stop; the woken code leaves the section (to save, or having finished);
    # only then does Python run the main thread's handler for that same signal. It must not raise.
    stop_request.reset()
    try:
        with stop_request.deferred():
            t = threading.Thread(target=stop_request.request)  # the watcher's part
            t.start()
            t.join()
            assert stop_request.event.wait(1)
        stop_request._on_signal(signal.SIGTERM, None)  # the late handler: the request is already recorded
        assert stop_request.requested()
    finally:
        stop_request.reset()
