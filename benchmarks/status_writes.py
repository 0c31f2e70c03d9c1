"""Status writes per job, counted at the API server, for benchmarks/operator_scale.py.

A watch on the DistTrainJobs of the benchmark's namespace sees every write the API server
stored (the API server sends one MODIFIED event per resourceVersion); an event whose status,
kopf's own bookkeeping left out, differs from the one before is one status write of the
operator. Each is classified as progress-only or a transition by the operator's own rule
(statusdiff.progress_only on the merge patch between the two statuses).

While a job is Running (from its Running write to the write that ends it), the design cap is
one progress-only write per PROGRESS_INTERVAL_S, whatever the number of its workers:
`summarize` reports the writes per job per minute in that window and the shortest gap between
a write and the next progress-only write of the same job (any write starts the interval).

Rank 0 of a benchmark job serves a Prometheus page whose disttrain_step advances twice a
second (`RANK0_METRICS`): a real endpoint with a real exposition, so the operator scrapes a new
step at every poll and has a progress change pending all the time, the case the cap is for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Served by the pod of worker 0 for --run-seconds, on the operator's metrics port
# ($DISTTRAIN_METRICS_PORT); the others sleep as long. Standard library only (the trainer image's
# python3), about 10 MB resident.
RANK0_METRICS = """
import http.server, os, time
t0, port, run_s = time.time(), int(os.environ["DISTTRAIN_METRICS_PORT"]), float(os.environ["RUN_SECONDS"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("# TYPE disttrain_step gauge\\ndisttrain_step %d\\n" % int((time.time() - t0) * 2)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("", port), H)
srv.timeout = 0.5
while time.time() - t0 < run_s:
    srv.handle_request()
"""


def worker_command(run_seconds: float) -> list[str]:
    """Worker 0 serves RANK0_METRICS for `run_seconds`, the others sleep as long; 0: `sleep 2`."""
    if run_seconds <= 0:
        return ["sh", "-c", "sleep 2"]
    script = RANK0_METRICS.replace("'", "'\"'\"'")
    return ["sh", "-c", f"export RUN_SECONDS={run_seconds:g}; if [ \"${{NODE_RANK:-0}}\" = 0 ]; then "
                        f"exec python3 -c '{script}'; else exec sleep {run_seconds:g}; fi"]  # fmt: skip


@dataclass
class JobWrites:
    writes: list[tuple[float, bool]] = field(default_factory=list)  # (seen at, progress only)
    running_at: float | None = None  # the write that made it Running
    ended_at: float | None = None  # the write that made it Succeeded or Failed


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    status = dict(obj.get("status") or {})
    status.pop("kopf", None)
    return status


class StatusWriteWatch:
    """Counts the status writes of every job in `namespace` from a watch (a thread)."""

    def __init__(self, custom: Any, namespace: str) -> None:
        self.custom, self.namespace = custom, namespace
        self.jobs: dict[str, JobWrites] = {}
        self._last: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-writes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def observe(self, name: str, obj: dict[str, Any], now: float) -> None:
        """One watch event of job `name` (ADDED or MODIFIED) seen at `now`."""
        from disttrain_operator.statusdiff import merge_patch, progress_only

        status, before = _status(obj), self._last.get(name, {})
        self._last[name] = status
        if status == before:
            return  # metadata only (kopf's annotations, finalizers), or the create itself
        job = self.jobs.setdefault(name, JobWrites())
        job.writes.append((now, progress_only(merge_patch(before, status))))
        phase = status.get("phase")
        if phase == "Running" and job.running_at is None:
            job.running_at = now
        if phase in ("Succeeded", "Failed") and job.ended_at is None:
            job.ended_at = now

    def _run(self) -> None:
        from kubernetes import watch

        version = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.custom.list_namespaced_custom_object, "disttrain.dev", "v1alpha1",
                                   self.namespace, "disttrainjobs", resource_version=version, timeout_seconds=5):
                    obj = ev["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.observe(obj["metadata"]["name"], obj, time.monotonic())
                    if self._stop.is_set():
                        w.stop()
            except Exception:  # noqa: BLE001 - an expired resourceVersion: list again
                version = None


def summarize(jobs: dict[str, JobWrites], *, interval_s: float, end: float) -> dict[str, Any]:
    """Writes per job per minute while Running (mean and max over jobs), progress-only ones
    among them, the shortest gap before a progress-only write, and whether the cap held:
    no job above 60 / interval progress writes a minute (one more for a window's ends) and no
    gap below the interval less a second of watch delivery jitter."""
    rates, progress_rates, gaps, lives = [], [], [], []
    for job in jobs.values():
        lives.append(len(job.writes))
        if job.running_at is None:
            continue
        stop = job.ended_at if job.ended_at is not None else end
        window = stop - job.running_at
        inside = [(t, p) for t, p in job.writes if job.running_at < t < stop]
        if window >= interval_s:
            rates.append(len(inside) * 60.0 / window)
            progress_rates.append(sum(p for _, p in inside) * 60.0 / window)
        times = [t for t, _ in job.writes]
        gaps += [t - prev for prev, (t, p) in zip(times, job.writes[1:], strict=False) if p]
    cap = 60.0 / interval_s
    worst = max(progress_rates, default=0.0)
    min_gap = min(gaps, default=None)
    return {
        "jobs_seen_running": len(rates),
        "status_writes_per_job": round(sum(lives) / len(lives), 1) if lives else None,
        "status_writes_per_job_per_min_running": round(sum(rates) / len(rates), 2) if rates else None,
        "progress_writes_per_job_per_min_running": round(sum(progress_rates) / len(progress_rates), 2)
        if progress_rates else None,
        "progress_writes_per_job_per_min_max": round(worst, 2),
        "progress_write_min_gap_s": round(min_gap, 2) if min_gap is not None else None,
        "progress_cap_per_min": cap,
        "progress_cap_held": worst <= cap + 1 and (min_gap is None or min_gap >= interval_s - 1.0),
    }  # fmt: skip
