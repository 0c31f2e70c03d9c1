"""A fault-tolerant replica's waits for the others: the gang's first quorum (all replicas, or
START_WAIT_S), the quorum of a step (every quorumIntervalSteps), and a LocalSGD / DiLoCo
synchronisation (its quorum included). A replica behind the others recovers their state inside the quorum (ft_state.py).

While a replica waits here a stop request (SIGTERM) ends the process at once, as in start-up
(process/stop_request.py): waiting, it holds nothing the checkpoint or the live peers do not,
and the quorum it waits for may never come (fewer than minReplicas left). A request that came
before the wait began ends it on entry: the processes of an HSDP group reach the quorum between
the same two steps, so they leave there. They do not leave it at the same instant, though: one
whose request came while it waited leaves at once, while a group peer whose request came a moment
later may already have its answer and be in the step's first collective with it. That peer's
collective then fails, and it too stops on request (`group_left_on_request`), not as a failure.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from disttrain_api import exitcodes

from ...parallel.sync import ManagerAverager
from ...process import stop_request
from .ft_state import ReplicaRun
from .ft_telemetry import ReplicaSeries

START_WAIT_S = 60.0
GATHER_POLL_S = 0.5
# How long a process whose group collective failed waits for its own SIGTERM: a pod's launcher
# (and `disttrain local`) sends it to every process of the group at once, the peer that left first
# was simply quicker.
PEER_REQUEST_WAIT_S = 2.0
# Set while this replica waits for the others.
_waiting = threading.Event()


def leave_if_waiting() -> None:
    if _waiting.is_set():
        os.write(2, b"disttrain-trainer: stopped on request while waiting for a quorum\n")
        os._exit(exitcodes.STOPPED)


@contextlib.contextmanager
def group_left_on_request(group_size: int) -> Iterator[None]:
    """Inside: an error of a process of an HSDP group that was asked to stop is the stop (a group
    peer left at the quorum while this one was past it, in a collective with it). It then leaves
    with STOPPED like the peer, holding nothing the checkpoint or the live replicas do not (the
    step was not committed). An error without a request (a peer was killed) stays a failure."""
    try:
        yield
    except Exception as e:
        if group_size > 1 and stop_request.event.wait(PEER_REQUEST_WAIT_S):
            raise stop_request.StopRequested(
                f"a process of this replica group left first; this one's collective with it failed: "
                f"{type(e).__name__}") from e
        raise


@contextlib.contextmanager
def for_peers() -> Iterator[None]:
    _waiting.set()
    if stop_request.requested():
        leave_if_waiting()
    try:
        yield
    finally:
        _waiting.clear()


def gather(r: ReplicaRun, series: ReplicaSeries) -> bool:
    """A gang that starts (fresh, or from the checkpoint after a gang restart) waits up to START_WAIT_S
    for all its replicas before the first step, as DDP's rendezvous would: the lighthouse forms a
    quorum as soon as minReplicas ask, and replicas still importing torch would miss the first steps.
    A quorum that is not complete is voted down (nothing trained) and asked again. A replica that
    finds the others ahead of it is a replacement: it recovers from them in the quorum and goes on.

    Returns whether the first step trains in the quorum it ends with (else it asks for another).
    - A replacement (it recovered in the quorum): yes, complete or not. The replicas already
      training asked for that quorum as their step's and go on into its all-reduce, so the
      replacement must not ask again: the lighthouse would keep it waiting there while they wait
      for it in the all-reduce, until its timeout failed their step (two replicas lost and one back
      is such an incomplete quorum).
    - A starting gang: when the quorum is complete (all spec.workers.replicas). Every member sees
      the same count, so all of them take it as the first step's; an incomplete one (the wait ran
      out) is asked again at the first step by all of them alike, as before any step."""
    deadline = time.monotonic() + START_WAIT_S
    while True:
        start = time.perf_counter()
        with for_peers():
            r.manager.start_quorum()
        if r.healed:
            r.healed = False
            r.note_recovery(time.perf_counter() - start)
            series.recovered(r.recovery_s)
            return True
        n = r.manager.num_participants()
        complete = n >= r.replica.replicas
        if complete or time.monotonic() >= deadline:
            series.quorum(r.manager, r.step)
            return complete
        r.manager.report_error(RuntimeError(f"waiting for all {r.replica.replicas} replicas (quorum {n})"))
        r.manager.should_commit()
        time.sleep(GATHER_POLL_S)


def step_quorum_due(manager: Any, *, every: int, last_committed: bool, after_alone: bool) -> bool:
    """Whether this step asks the lighthouse for a quorum (spec.faultTolerance.quorumIntervalSteps).

    Between two quorums a replica trains in the last one: its process group, rank and size stay
    configured, and torchft's step goes on counting committed steps. A step that did not commit (a
    peer failed in its all-reduce, the quorum was too small) asks at once, so a failure costs what it
    does with a quorum every step. Otherwise the quorum is due at torchft's step, which every member
    of a quorum shares (a replica that recovered took the others'), so all of them ask at the same
    step: one that asked alone would wait at the lighthouse while the others wait for it in the
    all-reduce. After a step at which the quorum's rank 0 checkpointed or evaluated alone the quorum
    is asked too, so that wait is the quorum's (idle), not the all-reduce's (communication). A stop
    request to an HSDP group waits for the next quorum too (for_peers)."""
    return (every == 1 or not last_committed or after_alone or manager.errored() is not None
            or manager.current_step() % every == 0)


def step_quorum(r: ReplicaRun, series: ReplicaSeries) -> tuple[None, float]:
    """The next step's quorum; a replica behind the others recovers their state inside it."""
    start = time.perf_counter()
    with for_peers():
        r.manager.start_quorum()
    seconds = time.perf_counter() - start
    if r.healed:
        r.healed = False
        r.note_recovery(seconds)
        series.recovered(seconds)
    series.quorum(r.manager, r.step)
    return None, seconds


def sync(r: ReplicaRun, series: ReplicaSeries) -> float:
    """A LocalSGD / DiLoCo synchronisation (its quorum included); returns its seconds."""
    assert r.outer is not None and isinstance(r.outer.averager, ManagerAverager)

    def on_quorum() -> None:
        if r.healed:
            r.healed = False
            r.note_recovery(time.perf_counter() - began)
            series.recovered(r.recovery_s)
        series.quorum(r.manager, r.step)

    r.outer.averager.on_quorum = on_quorum
    began = time.perf_counter()
    with for_peers():
        res = r.outer.sync()
    if not res.committed:
        r.discarded += 1
        series.discarded()
    else:
        series.synced(res.bytes)
    return res.comm.exposed_s
