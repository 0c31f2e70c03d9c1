"""The forecast's formulas against hand-computed cases (disttrain_api.scaling.collectives, pipeline_time)."""

from __future__ import annotations

import pytest
from disttrain_api.scaling import collectives as col
from disttrain_api.scaling.pipeline_time import (
    bubble_fraction,
    makespan,
    min_max_split,
    one_f_one_b,
    time_shared_makespan,
)

LINK = col.Link(alpha_s=1e-5, beta_bytes_per_s=1e9)


def test_ring_all_reduce_by_hand() -> None:
    # n = 4, 1 MB: 2 x 3 x 10 us + 2 x 3/4 x 1e6 B / 1e9 B/s = 60 us + 1.5 ms
    assert col.all_reduce_s(4, 1e6, LINK) == pytest.approx(60e-6 + 1.5e-3)
    # three calls share the bytes, each pays the latency
    assert col.all_reduce_s(4, 1e6, LINK, calls=3) == pytest.approx(180e-6 + 1.5e-3)
    assert col.all_reduce_s(1, 1e6, LINK) == 0.0
    assert col.all_reduce_s(4, 0, LINK) == 0.0


def test_all_gather_and_reduce_scatter_by_hand() -> None:
    # n = 8: 7 x 10 us + 7/8 x 1e6 / 1e9
    assert col.all_gather_s(8, 1e6, LINK) == pytest.approx(70e-6 + 0.875e-3)
    assert col.reduce_scatter_s(8, 1e6, LINK) == pytest.approx(70e-6 + 0.875e-3)
    # gloo runs a reduce-scatter as an all-reduce of the whole buffer
    assert col.reduce_scatter_s(8, 1e6, LINK, native=False) == pytest.approx(140e-6 + 1.75e-3)


def test_p2p_and_link_checks() -> None:
    assert col.p2p_s(1e6, LINK, messages=2) == pytest.approx(2 * (10e-6 + 1e-3))
    with pytest.raises(ValueError, match="bandwidth > 0"):
        col.Link(alpha_s=0.0, beta_bytes_per_s=0.0)


def test_contention_counts_threads_per_core() -> None:
    assert col.contention(ranks_on_host=4, threads_per_rank=1, cores=2) == 2.0
    assert col.contention(ranks_on_host=2, threads_per_rank=1, cores=2) == 1.0
    assert col.contention(ranks_on_host=1, threads_per_rank=1, cores=2) == 1.0  # an idle core speeds nothing up
    assert col.contention(ranks_on_host=3, threads_per_rank=2, cores=4) == 1.5


def test_topology_picks_the_bottleneck_hop() -> None:
    fast, slow = col.Link(alpha_s=0, beta_bytes_per_s=100e9), col.Link(alpha_s=0, beta_bytes_per_s=5e9)
    topo = col.Topology(ranks_per_host=8, intra=fast, inter=slow)
    assert topo.link_for(8) is fast
    assert topo.link_for(9) is slow


def test_fit_link_recovers_alpha_and_beta() -> None:
    n, alpha, beta = 4, 20e-6, 2e9
    samples = [(s, col.all_reduce_s(n, s, col.Link(alpha_s=alpha, beta_bytes_per_s=beta))) for s in (4e3, 64e3, 1e6, 4e6)]
    link = col.fit_link(n, samples)
    assert link.alpha_s == pytest.approx(alpha)
    assert link.beta_bytes_per_s == pytest.approx(beta)
    assert link.source == "probe"


def test_fit_link_keeps_a_noisy_probe_physical() -> None:
    # the small message took longer than the line through the big ones allows: no negative latency
    link = col.fit_link(2, [(4096, 1e-6), (1 << 20, 2e-3), (4 << 20, 4e-3)])
    assert link.alpha_s >= 0
    assert link.beta_bytes_per_s > 0
    with pytest.raises(ValueError, match="two message sizes"):
        col.fit_link(2, [(4096, 1e-4)])


def test_pipeline_makespan_equal_stages_is_gpipe() -> None:
    # p = 4 equal stages of 1 s, m = 8: (m + p - 1) x s = 11 s; bubble 3/11
    assert makespan([1.0] * 4, microbatches=8) == pytest.approx(11.0)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert 1 - 8 * 1.0 / makespan([1.0] * 4, microbatches=8) == pytest.approx(bubble_fraction(4, 8))


def test_pipeline_makespan_slowest_stage_sets_the_pace() -> None:
    # stages 1, 2, 1 s, m = 4: fill and drain 4 s, then 3 more micro-batches at 2 s
    assert makespan([1.0, 2.0, 1.0], microbatches=4) == pytest.approx(10.0)


def test_min_max_split_by_hand() -> None:
    assert min_max_split([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert min_max_split([4, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    # a stage pays the transfer of its last block's output: cutting after block 2 is free here
    assert min_max_split([1, 1, 1, 1], 2, cut_cost=[0, 0, 5, 0]) == [(0, 2), (2, 4)]
    # cuts after blocks 0 and 1 cost 5: the balanced split (max 2 + 5) loses to 3 + 1
    assert min_max_split([1, 1, 1, 1], 2, cut_cost=[5, 5, 0, 0]) == [(0, 3), (3, 4)]
    with pytest.raises(ValueError, match="every stage needs a block"):
        min_max_split([1, 1], 3)


def test_one_f_one_b_order() -> None:
    # 3 stages, 3 micro-batches: the first stage runs 2 forwards ahead, the last none.
    assert one_f_one_b(3, 3, 0) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert one_f_one_b(3, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


def test_time_shared_pipeline_by_hand() -> None:
    # 2 stages, forward 1 s, backward 2 s, 2 micro-batches, a core each: stage 0 F0 [0, 1]; F1 and
    # stage 1's F0 [1, 2]; stage 1 B0 [2, 4]; then stage 0 B0 [4, 6] beside stage 1 F1 [4, 5] and
    # B1 [5, 7]; stage 0 B1 [7, 9]: 9 s, the formula's (3 + 3) + (2 - 1) x 3 for a core per stage.
    assert time_shared_makespan([1, 1], [2, 2], microbatches=2, cores=2, message_s=0.0) == pytest.approx(9.0)
    assert makespan([3, 3], microbatches=2) == pytest.approx(9.0)
    # The same on one core: at 1 s, stage 0's F1 and stage 1's F0 share it (half speed each) to 3 s;
    # stage 1 B0 alone [3, 5]; stage 0 B0 and stage 1 F1 share [5, 7] (F1 done, B0 half); stage 0's
    # B0 and stage 1's B1 share [7, 9] (B0 done, B1 half); B1's rest [9, 10]; stage 0 B1 [10, 12].
    # 12 s: all the work on one core, no bubble left idle.
    assert time_shared_makespan([1, 1], [2, 2], microbatches=2, cores=1, message_s=0.0) == pytest.approx(12.0)
    # One micro-batch is a chain whatever the cores, each boundary crossed twice (0.5 s each way).
    assert time_shared_makespan([1, 1], [2, 2], microbatches=1, cores=1, message_s=0.5) == pytest.approx(7.0)
    assert time_shared_makespan([], [], microbatches=4, cores=1, message_s=0.0) == 0.0
