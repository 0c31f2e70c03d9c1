"""Step accounting: data + compute + exposed communication + idle add up to the step; busy overlaps."""

from __future__ import annotations

import pytest
from disttrain_trainer.telemetry.step_metrics import Tally


def test_tally_splits_a_step_and_clamps_communication_to_the_work_span() -> None:
    t = Tally()
    # data 1, work 4 (of which 1.5 exposed, 3 busy), idle 2, bookkeeping 0.5: step 7.5
    t.add_step(t0=0.0, t1=1.0, t2=5.0, end=7.5, exposed_s=1.5, busy_s=3.0, idle_s=2.0, samples=8)
    assert (t.data_s, t.compute_s, t.exposed_s, t.busy_s, t.idle_s) == (1.0, 2.5, 1.5, 3.0, 2.0)
    assert t.step_s == 7.5 and t.samples == 8
    # A collective reported longer than the work span is clamped to it: compute is never negative.
    t.add_step(t0=10.0, t1=10.0, t2=11.0, end=11.0, exposed_s=5.0, busy_s=5.0, idle_s=0.0, samples=8)
    assert t.exposed_s == 2.5 and t.busy_s == 4.0 and t.compute_s == 2.5


def test_tally_record_means_and_fractions_and_merge() -> None:
    a, b = Tally(), Tally()
    a.add_step(t0=0.0, t1=0.5, t2=3.5, end=4.0, exposed_s=1.0, busy_s=2.0, idle_s=0.0, samples=4)
    b.add_step(t0=0.0, t1=0.5, t2=2.5, end=4.0, exposed_s=0.0, busy_s=1.0, idle_s=1.0, samples=4)
    a.merge(b)
    rec = a.record()
    assert rec["steps"] == 2 and rec["step_s"] == 4.0 and rec["samples_per_s"] == 1.0
    assert rec["comm_exposed_fraction"] == pytest.approx(1.0 / 8)
    assert rec["comm_busy_fraction"] == pytest.approx(3.0 / 8)
    assert rec["idle_fraction"] == pytest.approx(1.0 / 8)
    assert rec["compute_s"] == pytest.approx((2.0 + 2.0) / 2)
    assert Tally().record()["samples_per_s"] == 0.0


def test_unmeasured_steps_are_split_like_the_measured_ones_and_the_categories_still_add_up() -> None:
    t = Tally()
    # two GPU steps the loop did not wait for (work 0.2 s and 3.8 s: the second absorbed the queue)
    t.add_step(t0=0.0, t1=0.1, t2=0.3, end=0.3, exposed_s=None, busy_s=None, idle_s=0.0, samples=4)
    t.add_step(t0=0.3, t1=0.4, t2=4.2, end=4.2, exposed_s=None, busy_s=None, idle_s=0.0, samples=4)
    # the measured step: work 2 s, 0.5 exposed (25 %), 1 busy (50 %)
    t.add_step(t0=4.2, t1=4.3, t2=6.3, end=6.5, exposed_s=0.5, busy_s=1.0, idle_s=0.2, samples=4)
    rec = t.record()  # settles: the unmeasured 4 s of work is 25 % exposed, 50 % busy
    assert t.exposed_s == pytest.approx(0.5 + 1.0) and t.busy_s == pytest.approx(1.0 + 2.0)
    assert t.compute_s == pytest.approx(1.5 + 3.0)
    assert t.data_s + t.compute_s + t.exposed_s + t.idle_s == pytest.approx(t.step_s)
    assert rec["comm_exposed_fraction"] == pytest.approx(1.5 / 6.5)
    t.settle()  # idempotent
    assert t.exposed_s == pytest.approx(1.5)


def test_a_merge_settles_both_sides_and_work_with_nothing_measured_is_compute() -> None:
    run, interval = Tally(), Tally()
    interval.add_step(t0=0.0, t1=0.0, t2=1.0, end=1.0, exposed_s=None, busy_s=None, idle_s=0.0, samples=1)
    run.merge(interval)
    assert (run.compute_s, run.exposed_s, run.busy_s, run.unmeasured_work_s) == (1.0, 0.0, 0.0, 0.0)


def test_a_cpu_loop_reads_the_comm_timer_on_a_sample_of_steps_and_every_interval_end() -> None:
    from disttrain_trainer.modes.data.loop import CPU_COMM_SAMPLE_EVERY, measures_comm  # noqa: PLC0415 - imports torch

    def read(cuda: bool) -> list[int]:
        return [s for s in range(1, 36) if measures_comm(s, log_every=15, steps=35, cuda=cuda)]

    assert CPU_COMM_SAMPLE_EVERY == 10  # the figures below assume it
    assert read(cuda=False) == [10, 15, 20, 30, 35]  # every 10th, each interval's last, the run's last
    assert read(cuda=True) == [15, 30, 35]  # a GPU loop that runs ahead reads interval ends only


def test_fold_steps_adds_an_intervals_records_to_the_tally_and_the_timed_ones_to_the_histogram() -> None:
    from disttrain_api import metric_names as names
    from disttrain_trainer.telemetry.step_metrics import Metrics, fold_steps

    m = Metrics(job="j", rank=0, mode="data", port=0, run_dir=None)
    records = [
        (0.0, 0.5, 3.5, 4.0, 1.0, 2.0, 0.0, 4, True),  # measured, timed
        (4.0, 4.5, 6.5, 7.0, None, None, 0.0, 4, False),  # neither (a GPU step the loop ran ahead of)
        (7.0, 7.5, 9.5, 10.5, None, None, 0.5, 4, True),  # not measured, timed (a CPU step)
    ]
    t = Tally()
    fold_steps(records, t, m)
    assert records == []  # the next interval starts empty
    assert (t.steps, t.samples, t.step_s, t.data_s, t.idle_s) == (3, 12, 10.5, 1.5, 0.5)
    t.settle()  # 4 s of unmeasured work, split like the measured 3 s: a third exposed, two thirds busy
    assert t.exposed_s == pytest.approx(1.0 + 4.0 / 3) and t.busy_s == pytest.approx(2.0 + 8.0 / 3)
    labels = {names.LABEL_JOB: "j", names.LABEL_NAMESPACE: "default", names.LABEL_RANK: "0", names.LABEL_MODE: "data"}
    assert m.registry.get_sample_value(names.STEP_SECONDS + "_count", labels) == 2
    assert m.registry.get_sample_value(names.STEP_SECONDS + "_sum", labels) == pytest.approx(4.0 + 3.5)
