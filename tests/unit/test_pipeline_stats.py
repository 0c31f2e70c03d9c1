"""The split of a stage's step window into compute, p2p and bubble, on hand-made timelines."""

from __future__ import annotations

import pytest
from disttrain_trainer.modes.pipeline.stage_times import split_idle, theory_bubble


def gpipe_timeline(stages: int, mbs: int, tf: float, tb: float, hop: float) -> list[list[tuple]]:
    """An ideal GPipe run: forwards flow down, backwards flow up, each hop takes `hop` seconds."""
    ranks: list[list[tuple]] = [[] for _ in range(stages)]
    f_end: dict[tuple[int, int], float] = {}
    for s in range(stages):
        free = 0.0
        for m in range(mbs):
            ready = f_end[(s - 1, m)] + hop if s else 0.0
            t0 = max(free, ready)
            f_end[(s, m)] = free = t0 + tf
            ranks[s].append(("F", s, m, t0, free))
    b_end: dict[tuple[int, int], float] = {}
    frees = [max(iv[4] for iv in r) for r in ranks]
    for s in reversed(range(stages)):
        for m in range(mbs):
            ready = b_end[(s + 1, m)] + hop if s < stages - 1 else f_end[(s, mbs - 1)]
            t0 = max(frees[s], ready)
            b_end[(s, m)] = frees[s] = t0 + tb
            ranks[s].append(("B", s, m, t0, frees[s]))
    return ranks


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (4, 8), (3, 2)])
def test_ideal_gpipe_bubble_is_the_theory(p: int, m: int) -> None:
    ranks = gpipe_timeline(p, m, tf=1.0, tb=2.0, hop=0.0)
    for s in range(p):
        t = split_idle(ranks[s], ranks, p)
        assert t.p2p_s == pytest.approx(0.0)
        assert t.compute_s == pytest.approx(3.0 * m)
        assert t.compute_s + t.p2p_s + t.bubble_s == pytest.approx(t.window_s)
        assert t.bubble_fraction == pytest.approx(theory_bubble(p, m))


def test_transfer_time_is_p2p_not_bubble() -> None:
    hop = 0.25
    ranks = gpipe_timeline(2, 2, tf=1.0, tb=1.0, hop=hop)
    last = split_idle(ranks[1], ranks, 2)
    # Stage 1 waits for F0 (1 s of stage 0's compute: bubble) plus the hop (p2p); its second
    # forward's input arrived while it computed the first.
    assert last.p2p_s == pytest.approx(hop)
    first = split_idle(ranks[0], ranks, 2)
    assert first.p2p_s == pytest.approx(hop)  # the first gradient's hop back
    for t in (first, last):
        assert t.compute_s + t.p2p_s + t.bubble_s == pytest.approx(t.window_s)


def test_the_first_stage_has_no_bubble_when_it_is_the_bottleneck() -> None:
    """A first stage ten times slower than the second (on a busy host: starved of CPU) never waits
    for its peer: each gradient is back before it is free, and it ends the step. Its bubble is 0,
    while the second stage's is most of the window; a test may not expect a bubble on every stage."""
    slow = [("F", 0, 0, 0.0, 10.0), ("F", 0, 1, 10.0, 20.0), ("B", 0, 0, 20.0, 40.0), ("B", 0, 1, 40.0, 60.0)]
    fast = [("F", 1, 0, 10.0, 11.0), ("B", 1, 0, 11.0, 12.0), ("F", 1, 1, 20.0, 21.0), ("B", 1, 1, 21.0, 22.0)]
    ranks = [slow, fast]
    first, second = (split_idle(r, ranks, 2) for r in ranks)
    assert first.bubble_s == 0.0 and first.p2p_s == 0.0 and first.compute_s == 60.0
    assert second.bubble_s == pytest.approx(10.0 + 8.0 + 38.0) and second.p2p_s == 0.0
