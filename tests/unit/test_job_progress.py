"""status.progress: the recent rate and its ETA, the block the operator writes, and the limit on
how often a job's progress alone is written (disttrain_api/progress.py, statusdiff.ProgressWrites)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from disttrain_api import model as api
from disttrain_api import progress as p
from disttrain_operator.statusdiff import ProgressWrites

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def spec(**over: object) -> api.JobSpec:
    base: dict[str, object] = {"mode": "data", "workers": {"replicas": 2}, "data": {"batchSize": 128},
                               "training": {"steps": 1000}}  # fmt: skip
    base.update(over)
    return api.parse_spec(base)


def test_blended_rate_weighs_a_window_by_its_length_against_the_half_life() -> None:
    assert p.blended_rate(None, 7.0, 10.0) == 7.0  # the first window is the rate
    # a window of one half-life: half the new, half the old
    assert p.blended_rate(2.0, 4.0, p.RATE_HALF_LIFE_S) == pytest.approx(3.0)
    # two half-lives: the old rate keeps a quarter
    assert p.blended_rate(2.0, 4.0, 2 * p.RATE_HALF_LIFE_S) == pytest.approx(0.25 * 2.0 + 0.75 * 4.0)


def test_eta_follows_the_recent_rate_not_the_whole_run_mean() -> None:
    basis = p.basis_for(spec())
    # 200 steps in the first 100 s (2 steps/s), then the job slows to 0.5 steps/s for 120 s (60 steps).
    block = p.build(None, completed=0, basis=basis, now=T0)
    block = p.build(block, completed=200, basis=basis, now=T0 + timedelta(seconds=100))
    assert block["rate"] == 2.0 and block["etaSeconds"] == 400  # 800 left at 2/s
    now = T0 + timedelta(seconds=100)
    for _ in range(12):
        now += timedelta(seconds=10)
        block = p.build(block, completed=int(block["completed"]) + 5, basis=basis, now=now)
    # Each window weighs its length, halved every 30 s since: after 120 s the first (100 s at 2/s)
    # weighs 100 x 2^-4, the twelve 10 s windows at 0.5/s the rest.
    old = 100 * 0.5 ** (120 / p.RATE_HALF_LIFE_S)
    recent = sum(10 * 0.5 ** (10 * k / p.RATE_HALF_LIFE_S) for k in range(12))
    expected_rate = (2.0 * old + 0.5 * recent) / (old + recent)
    assert block["completed"] == 260 and block["rate"] == pytest.approx(expected_rate, abs=5e-4)
    assert block["etaSeconds"] == pytest.approx(740 / expected_rate, abs=2)  # ~1246 s
    whole_run_mean = 260 / 220
    assert block["etaSeconds"] > 1.6 * (740 / whole_run_mean)  # the mean (~626 s) would promise far less
    assert block["samplesPerSecond"] == pytest.approx(block["rate"] * 128, abs=0.1)
    assert block["percent"] == 26.0 and block["total"] == 1000 and block["unit"] == "steps"
    assert block["lastUpdateTime"] == "2026-01-01T12:03:40.000Z"


def test_a_short_slow_first_window_does_not_outweigh_the_windows_after_it() -> None:
    """A run observed for less than a half-life gets about its mean since the first reading: a slow
    first window (warm-up, a probe) weighs its length, not the whole rate until 30 s have passed."""
    basis = p.basis_for(spec())
    block = p.build(None, completed=25, basis=basis, now=T0)
    block = p.build(block, completed=50, basis=basis, now=T0 + timedelta(seconds=1.0))  # 25/s
    now = T0 + timedelta(seconds=1.0)
    for _ in range(10):  # then 50/s for 5 s
        now += timedelta(seconds=0.5)
        block = p.build(block, completed=int(block["completed"]) + 25, basis=basis, now=now)
    assert block["rate"] == pytest.approx(275 / 6.0, rel=0.06)  # the mean since the first reading
    assert p.blend(2.0, None, 4.0, 30.0) == (pytest.approx(p.blended_rate(2.0, 4.0, 30.0)), pytest.approx(60.0))


def test_the_eta_adds_the_finish_and_a_restart_re_anchors_the_window_keeping_the_rate() -> None:
    basis = p.basis_for(spec())
    first = p.build(None, completed=100, basis=basis, now=T0, finish_s=30.0)
    second = p.build(first, completed=150, basis=basis, now=T0 + timedelta(seconds=10), finish_s=30.0)
    assert second["rate"] == 5.0 and second["etaSeconds"] == 850 / 5 + 30
    anchor = p.restarted(second)
    assert anchor is not None and "lastUpdateTime" not in anchor and anchor["rate"] == 5.0
    # The new gang's first reading, a minute later, from its checkpoint at 140: no slow window, the rate stands.
    resumed = p.build(anchor, completed=140, basis=basis, now=T0 + timedelta(seconds=70))
    assert resumed["completed"] == 140 and resumed["rate"] == 5.0 and resumed["etaSeconds"] == 860 / 5
    assert resumed["lastUpdateTime"] == "2026-01-01T12:01:10.000Z"


def test_a_stalled_count_is_not_rewritten_and_a_count_going_back_starts_the_rate_over() -> None:
    basis = p.basis_for(spec())
    first = p.build(None, completed=100, basis=basis, now=T0)
    assert "rate" not in first and "etaSeconds" not in first  # one reading: no rate yet
    second = p.build(first, completed=150, basis=basis, now=T0 + timedelta(seconds=10))
    assert second["rate"] == 5.0 and second["eta"] == "2m50s"
    assert p.build(second, completed=150, basis=basis, now=T0 + timedelta(seconds=60)) is second
    resumed = p.build(second, completed=120, basis=basis, now=T0 + timedelta(seconds=70))  # an older checkpoint
    assert resumed["completed"] == 120 and "rate" not in resumed and "eta" not in resumed


def test_units_per_mode_and_model() -> None:
    fed = p.basis_for(spec(mode="federated", federated={"rounds": 40}))
    assert (fed.unit, fed.total, fed.samples_per_unit) == ("rounds", 40, None)
    block = p.build(p.build(None, completed=10, basis=fed, now=T0), completed=12, basis=fed,
                    now=T0 + timedelta(seconds=20))  # fmt: skip
    assert block["unit"] == "rounds" and block["percent"] == 30.0 and block["rate"] == 0.1
    assert "samplesPerSecond" not in block and block["etaSeconds"] == 280
    gpt = p.basis_for(spec(model={"name": "gpt", "blockSize": 32}, data={"name": "pytext", "batchSize": 16}))
    block = p.build(p.build(None, completed=0, basis=gpt, now=T0), completed=20, basis=gpt,
                    now=T0 + timedelta(seconds=10), mfu=0.41234)  # fmt: skip
    assert block["samplesPerSecond"] == 32.0 and block["tokensPerSecond"] == 1024.0 and block["mfu"] == 0.4123


def test_a_finished_job_has_nothing_left_and_reports_the_trainers_own_throughput() -> None:
    basis = p.basis_for(spec())
    block = p.finished({"completed": 990, "rate": 3.0}, completed=1000, basis=basis, now=T0,
                       result={"samplesPerS": 1234.56, "tokensPerS": None, "mfu": 0.123456})  # fmt: skip
    assert block["percent"] == 100.0 and block["etaSeconds"] == 0 and block["eta"] == "0s"
    assert block["samplesPerSecond"] == 1234.6 and block["mfu"] == 0.1235 and "tokensPerSecond" not in block
    # A parameter-server worker's samplesPerS is its own (idle waits included): the recent rate's stays.
    ps = p.basis_for(spec(mode="paramserver", workers={"replicas": 4}))
    block = p.finished({"completed": 990, "rate": 3.0}, completed=1000, basis=ps, now=T0, result={"samplesPerS": 50.0})
    assert block["samplesPerSecond"] == 3.0 * 128


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (59, "59s"), (60, "1m00s"), (725, "12m05s"),
                                              (3600 * 3 + 7 * 60 + 30, "3h07m"), (86400 * 2 + 3600 * 4, "2d04h")])
def test_format_eta(seconds: float, text: str) -> None:
    assert p.format_eta(seconds) == text


def test_the_block_parses_as_the_status_model() -> None:
    basis = p.basis_for(spec())
    block = p.build(p.build(None, completed=0, basis=basis, now=T0), completed=20, basis=basis,
                    now=T0 + timedelta(seconds=10))  # fmt: skip
    status = api.parse_status({"phase": "Running", "progress": block})
    assert status.progress is not None and status.progress.eta_seconds == 490 and status.progress.rate == 2.0


def test_progress_writes_at_most_once_per_interval_whatever_the_number_of_readings() -> None:
    """64 workers' pod events and a reading every 0.5 s for two minutes: one write per 10 s,
    the first 10 s after the change was seen."""
    limit = ProgressWrites(p.PROGRESS_INTERVAL_S)
    writes: list[float] = []
    now = 1000.0
    while now < 1120.0:
        for _worker in range(64):  # each event decides again; the change is progress only
            if limit.wait_s("ns/job", now) <= 0:
                writes.append(now)
                limit.written("ns/job", now)
        now += 0.5
    gaps = [b - a for a, b in zip(writes, writes[1:], strict=False)]
    assert len(writes) == 11 and min(gaps) >= p.PROGRESS_INTERVAL_S  # at 1010, 1020, ... 1110
    # Jobs are limited each on its own; a change waits an interval from when it was first seen.
    assert limit.wait_s("ns/other", now) == p.PROGRESS_INTERVAL_S
    limit.written("ns/job", now)  # a transition write carries the latest progress
    assert limit.wait_s("ns/job", now + 1.0) == p.PROGRESS_INTERVAL_S
    assert limit.wait_s("ns/job", now + 4.0) == pytest.approx(p.PROGRESS_INTERVAL_S - 3.0)
    limit.undone("ns/job")  # the change went away before its write; the next one waits anew
    assert limit.wait_s("ns/job", now + 20.0) == p.PROGRESS_INTERVAL_S
    limit.forget("ns/job")
    assert limit.wait_s("ns/job", now + 21.0) == p.PROGRESS_INTERVAL_S
