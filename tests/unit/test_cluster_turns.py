"""The cluster tiers' turns (tests/conftest.py): a whole_cluster test that waits for the cluster
is not overtaken by the other lane's later tests. Real flock locks, one open file per holder,
as the xdist workers hold them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..conftest import turn_lock  # type: ignore[import-not-found]


def test_a_waiting_exclusive_turn_comes_before_a_later_shared_one(tmp_path: Path) -> None:
    lock, gate = tmp_path / "turn.lock", tmp_path / "turn.gate"
    order: list[str] = []
    release_first = threading.Event()
    first_holds = threading.Event()

    def holder(name: str, *, exclusive: bool, hold: threading.Event | None = None) -> None:
        with turn_lock(exclusive=exclusive, lock=lock, gate=gate):
            order.append(name)
            if hold is not None:
                first_holds.set()
                hold.wait(30)

    first = threading.Thread(target=holder, args=("lane-1 test",), kwargs={"exclusive": False, "hold": release_first})
    first.start()
    assert first_holds.wait(10)
    whole = threading.Thread(target=holder, args=("whole_cluster test",), kwargs={"exclusive": True})
    whole.start()
    time.sleep(0.5)  # the whole_cluster test now waits for the lane-1 test to end
    later = threading.Thread(target=holder, args=("lane-1 next test",), kwargs={"exclusive": False})
    later.start()
    time.sleep(0.5)
    assert order == ["lane-1 test"], f"a later shared turn overtook the waiting exclusive one: {order}"
    release_first.set()
    for t in (first, whole, later):
        t.join(10)
    assert order == ["lane-1 test", "whole_cluster test", "lane-1 next test"]


def test_shared_turns_overlap(tmp_path: Path) -> None:
    lock, gate = tmp_path / "turn.lock", tmp_path / "turn.gate"
    with turn_lock(exclusive=False, lock=lock, gate=gate):
        done = threading.Event()

        def other() -> None:
            with turn_lock(exclusive=False, lock=lock, gate=gate):
                done.set()

        t = threading.Thread(target=other)
        t.start()
        assert done.wait(5), "two lanes' shared turns must run at once"
        t.join(5)
