"""Gang bookkeeping with real (tiny) child processes: outcomes, blame, pids file, stop."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from disttrain_trainer.launcher.env import gang_slots
from disttrain_trainer.launcher.gang import BLAME_SETTLE_S, Failure, Gang, describe_exit

# Each child runs this program; its behaviour depends on RANK.
PROGRAM = """
import os, sys, time
rank = int(os.environ["RANK"])
mode = os.environ["MODE"]
if mode == "ok":
    sys.exit(0)
if mode == "fail" and rank == 1:
    print("disttrain-trainer: boom on rank 1", file=sys.stderr)
    sys.exit(1)
if mode == "exit3" and rank == 1:
    sys.exit(3)  # the stop code, with no stop asked for
if mode == "stop3":
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))  # as the trainer: stop on SIGTERM, exit 3
    print("ready", flush=True)
if mode == "config":
    # Rank 0 exits 1 first (as if its connection broke), rank 1 rejects the config after it.
    if rank == 1:
        time.sleep(0.5)
        sys.exit(2)
    sys.exit(1)
if mode == "killed":
    # Rank 0 exits 1 at once (its connection broke), rank 1 dies of SIGKILL a moment later: the order
    # in which a busy host's launcher can see a killed rank and the peer it took down.
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    sys.exit(1)
time.sleep(60)
"""


def _start(tmp_path: Path, mode: str) -> Gang:
    envs = [
        (s, {"RANK": str(s.rank), "MODE": mode, "PATH": "/usr/bin:/bin"}) for s in gang_slots(2, 1)
    ]
    return Gang.start(
        command=[sys.executable, "-c", PROGRAM], envs=envs, run_dir=tmp_path, attempt=3
    )


def _wait(gang: Gang, timeout: float = 30) -> Failure | bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        outcome = gang.poll()
        if outcome is not False:
            return outcome
        time.sleep(0.05)
    return False


def test_all_exit_zero_is_success_and_pids_are_published(tmp_path: Path) -> None:
    gang = _start(tmp_path, "ok")
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert pids["attempt"] == 3 and {int(k): v for k, v in pids["pids"].items()} == gang.pids
    assert _wait(gang) is True


def test_a_failing_rank_is_reported_with_its_last_line(tmp_path: Path) -> None:
    gang = _start(tmp_path, "fail")
    outcome = _wait(gang)
    assert isinstance(outcome, Failure)
    assert outcome.rank == 1 and outcome.returncode == 1
    assert outcome.reason.endswith("exit code 1: disttrain-trainer: boom on rank 1")
    gang.stop(grace_s=5)
    assert all(m.proc.returncode is not None for m in gang._members)
    assert "attempt 3, rank 1" in (tmp_path / "logs" / "rank1.log").read_text()


def test_stop_terminates_sleeping_processes(tmp_path: Path) -> None:
    gang = _start(tmp_path, "sleep")
    time.sleep(0.3)
    assert gang.poll() is False
    started = time.monotonic()
    gang.stop(grace_s=5)
    assert time.monotonic() - started < 5  # SIGTERM was enough
    assert describe_exit(gang._members[0].proc.returncode) == "killed by SIGTERM"


def test_describe_exit() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"


def test_a_config_rejection_decides_the_outcome_over_a_peers_transient_exit(tmp_path: Path) -> None:
    gang = _start(tmp_path, "config")
    for m in gang._members:  # both have exited: the lower rank's exit 1 must not hide rank 1's exit 2
        m.proc.wait(timeout=30)
    outcome = gang.poll()
    assert isinstance(outcome, Failure)
    assert (outcome.rank, outcome.returncode) == (1, 2)


def test_a_plain_exit_waits_for_its_peers_so_a_rank_killed_by_a_signal_is_blamed(tmp_path: Path) -> None:
    gang = _start(tmp_path, "killed")
    gang._members[0].proc.wait(timeout=30)
    assert gang.poll() is False  # rank 0's exit 1 alone, rank 1 not reported yet: not blamed yet
    outcome = _wait(gang)
    assert isinstance(outcome, Failure)
    assert (outcome.rank, outcome.returncode) == (1, -9) and outcome.reason.startswith("rank 1 (pid")


def test_a_plain_exit_is_blamed_after_the_settle_time_while_its_peers_run(tmp_path: Path) -> None:
    gang = _start(tmp_path, "fail")
    gang._members[1].proc.wait(timeout=30)
    seen = time.monotonic()
    outcome = _wait(gang)
    waited = time.monotonic() - seen
    assert isinstance(outcome, Failure) and (outcome.rank, outcome.returncode) == (1, 1)
    assert BLAME_SETTLE_S <= waited < BLAME_SETTLE_S + 5, waited
    gang.stop(grace_s=5)


def test_exit_3_is_a_disruption_only_after_the_launchers_own_sigterm(tmp_path: Path) -> None:
    """The stop code alone proves nothing: a process whose own code exits 3 failed (counted against
    backoffLimit), one that exits 3 on the SIGTERM this launcher sent was disrupted."""
    gang = _start(tmp_path / "own", "exit3")
    outcome = _wait(gang)
    assert isinstance(outcome, Failure) and (outcome.rank, outcome.returncode) == (1, 3)
    assert not outcome.stop_sent and not outcome.disruption
    gang.stop(grace_s=5)

    gang = _start(tmp_path / "asked", "stop3")
    logs = [tmp_path / "asked" / "logs" / f"rank{r}.log" for r in (0, 1)]
    deadline = time.monotonic() + 30
    while not all("ready" in log.read_text() for log in logs):  # the handlers are installed
        assert time.monotonic() < deadline, [log.read_text() for log in logs]
        time.sleep(0.05)
    assert gang.poll() is False
    gang.stop(grace_s=5)
    outcome = gang.poll()
    assert isinstance(outcome, Failure) and outcome.returncode == 3, outcome
    assert outcome.stop_sent and outcome.disruption


def test_only_the_stop_code_after_a_requested_stop_is_a_disruption() -> None:
    def failure(code: int, sent: bool) -> Failure:
        return Failure(rank=0, pid=1, returncode=code, log=Path("x"), log_tail=(), stop_sent=sent)

    assert failure(3, True).disruption
    assert not failure(3, False).disruption  # a model that exits 3 by itself
    assert not failure(1, True).disruption and not failure(-9, True).disruption  # crashed or killed while stopping
