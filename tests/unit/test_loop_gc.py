"""The training loop's garbage-collector control: off inside the loop, cycles collected
every N steps, the collector as it was afterwards (also when the loop raises)."""

from __future__ import annotations

import gc
import weakref

import pytest
from disttrain_trainer.process.loop_gc import LoopGC


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_cycles_wait_for_the_interval_then_are_collected() -> None:
    assert gc.isenabled()
    with LoopGC(every=5) as loop_gc:
        assert not gc.isenabled()
        node = Node()
        ref = weakref.ref(node)
        del node
        for step in range(1, 5):
            loop_gc.after_step(step)
            assert ref() is not None, f"collected at step {step}, before the interval"
        loop_gc.after_step(5)
        assert ref() is None, "a cycle made inside the loop survived the collection at the interval"
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_objects_alive_at_the_start_are_frozen_during_the_loop() -> None:
    keep = [Node() for _ in range(10)]
    with LoopGC():
        assert gc.get_freeze_count() >= len(keep)
    assert gc.get_freeze_count() == 0


def test_the_collector_is_restored_when_the_loop_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), LoopGC():
        raise RuntimeError("boom")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with LoopGC():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every must be >= 1"):
        LoopGC(every=0)
