"""The operator-scale benchmark's count of status writes (benchmarks/status_writes.py): a job's
watch events in, writes per minute while it runs and the progress cap's verdict out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from status_writes import JobWrites, StatusWriteWatch, summarize  # noqa: E402


def events(progress_every: float, *, run_s: float = 60.0) -> list[tuple[float, dict[str, Any]]]:
    """A job's objects as a watch shows them: created, kopf's annotation, Pending, Running, a
    progress write every `progress_every` seconds while it runs, Succeeded."""
    out: list[tuple[float, dict[str, Any]]] = [(0.0, {}), (0.1, {"kopf": {"x": 1}}), (0.2, {"phase": "Pending"})]
    running = {"phase": "Running", "step": 0}
    out.append((1.0, running))
    t, step = 1.0 + progress_every, 0
    while t < 1.0 + run_s:
        step += 20
        out.append((t, {**running, "step": step, "progress": {"completed": step}}))
        out.append((t + 0.05, {**running, "step": step, "progress": {"completed": step}, "kopf": {"y": 2}}))
        t += progress_every
    out.append((1.0 + run_s, {"phase": "Succeeded", "step": step}))
    return out


def count(progress_every: float) -> dict[str, JobWrites]:
    watch = StatusWriteWatch(custom=None, namespace="ns")
    for now, status in events(progress_every):
        watch.observe("job", {"metadata": {"name": "job"}, "status": status}, now)
    return watch.jobs


def test_a_job_within_the_cap() -> None:
    jobs = count(10.0)
    job = jobs["job"]
    # Pending, Running, five progress writes (11, 21, ... 51 s), Succeeded; kopf's keys are no writes.
    assert [p for _, p in job.writes] == [False, False, True, True, True, True, True, False]
    assert (job.running_at, job.ended_at) == (1.0, 61.0)
    out = summarize(jobs, interval_s=10.0, end=100.0)
    assert out["status_writes_per_job"] == 8
    assert out["progress_writes_per_job_per_min_running"] == 5.0 and out["status_writes_per_job_per_min_running"] == 5.0
    assert out["progress_write_min_gap_s"] == 10.0 and out["progress_cap_per_min"] == 6.0
    assert out["progress_cap_held"]


def test_progress_written_at_every_scrape_breaks_the_cap() -> None:
    out = summarize(count(3.0), interval_s=10.0, end=100.0)
    assert out["progress_writes_per_job_per_min_max"] == 19.0 and out["progress_write_min_gap_s"] == 3.0
    assert not out["progress_cap_held"]
