"""CommTimer: the union of in-flight collective intervals, reset on every take."""

from __future__ import annotations

from disttrain_trainer.parallel.data import CommTimer


def test_comm_timer_counts_overlapping_collectives_once() -> None:
    t = CommTimer()
    t.add(0.0, 1.0, 10)
    t.add(0.5, 1.5, 10)
    t.add(3.0, 4.0, 5)
    assert t.take() == (2.5, 25)
    assert t.take() == (0.0, 0)
