"""Parameter-server series (Prometheus) and JSON-lines logs, for server shards and workers.

A worker's step splits like a data-parallel step, so one plot and one dashboard
fit both: data (fetching the batch), compute (forward + backward), communication
(pull + push: nothing overlaps them, so exposed = busy) and idle (waiting for the
server: retry backoff while it restarts, and the wait for the others at the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from disttrain_api import metric_names as names
from prometheus_client import Counter, Histogram

from ..tracking.tracker import TrackingTarget
from .sink import LazyGauge, MetricsSink, StepTimeSeries

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
APPLY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class ServerMetrics(MetricsSink):
    def __init__(self, *, job: str, shard: int, port: int, log_path: Path | None):
        super().__init__(labels={names.LABEL_JOB: job, "process": f"server-{shard}", names.LABEL_MODE: "paramserver"},
                         port=port, log_path=log_path)  # fmt: skip
        keys = tuple(self.labels)
        r = self.registry
        self.version = self.gauge(names.PS_VERSION, "Updates this shard has applied.")
        self.last_ckpt = self.gauge(names.LAST_CHECKPOINT_STEP, "Version of this shard's newest checkpoint.")
        self.staleness = Histogram(names.PS_STALENESS, "Versions a pushed gradient lagged the shard (accepted or not).",
                                   keys, buckets=STALENESS_BUCKETS, registry=r).labels(**self.labels)  # fmt: skip
        self.apply_seconds = Histogram(names.PS_APPLY_SECONDS, "Seconds to apply one gradient (optimizer step).",
                                       keys, buckets=APPLY_BUCKETS, registry=r).labels(**self.labels)  # fmt: skip
        self.accepted_total = self.counter(names.PS_PUSHES_ACCEPTED, "Gradients applied.")
        self._rejected = Counter(names.PS_PUSHES_REJECTED, "Pushes (and calls refused at the gate) refused, by reason.",
                                 (*keys, "reason"), registry=r)
        self.push_bytes = self.counter(names.PS_SERVER_PUSH_BYTES, "Gradient bytes received.")
        self.pull_bytes = self.counter(names.PS_SERVER_PULL_BYTES, "Parameter bytes sent.")

    def accepted(self, *, staleness: int, apply_s: float, version: int) -> None:
        self.apply_seconds.observe(apply_s)
        self.accepted_total.inc()
        self.version.set(version)

    def rejected(self, reason: str) -> None:
        self._rejected.labels(**self.labels, reason=reason).inc()

    def rejected_count(self, reason: str) -> float:
        return self._rejected.labels(**self.labels, reason=reason)._value.get()

    def checkpoint(self, version: int, seconds: float, nbytes: int) -> None:
        self.last_ckpt.set(version)
        self.write({"event": "checkpoint", "version": version, "checkpoint_s": seconds, "checkpoint_bytes": nbytes})


@dataclass(kw_only=True, slots=True)
class WorkerTally:
    """Sums over a log interval or a run; the loop adds into it every iteration."""

    steps: int = 0
    samples: int = 0
    step_s: float = 0.0
    data_s: float = 0.0
    compute_s: float = 0.0
    pull_s: float = 0.0
    push_s: float = 0.0
    idle_s: float = 0.0
    pull_bytes: int = 0
    push_bytes: int = 0
    rejected: int = 0
    loss_sum: float = 0.0

    def merge(self, other: WorkerTally) -> None:
        for f in self.__slots__:  # type: ignore[attr-defined]
            setattr(self, f, getattr(self, f) + getattr(other, f))

    @property
    def comm_s(self) -> float:
        return self.pull_s + self.push_s

    def fraction(self, seconds: float) -> float:
        return seconds / self.step_s if self.step_s > 0 else 0.0

    def record(self) -> dict[str, float]:
        """Per-step means: the JSON-lines fields the launcher's plot and the data mode share."""
        n = max(1, self.steps)
        return {
            "loss": self.loss_sum / n,
            "samples_per_s": self.samples / self.step_s if self.step_s > 0 else 0.0,
            "step_s": self.step_s / n,
            "data_s": self.data_s / n,
            "compute_s": self.compute_s / n,
            "comm_s": self.comm_s / n,
            "comm_exposed_s": self.comm_s / n,
            "comm_busy_s": self.comm_s / n,
            "idle_s": self.idle_s / n,
            "pull_s": self.pull_s / n,
            "push_s": self.push_s / n,
            "pull_bytes": self.pull_bytes / n,
            "push_bytes": self.push_bytes / n,
            "rejected": self.rejected,
        }


class WorkerMetrics(MetricsSink):
    def __init__(self, *, job: str, rank: int, port: int, log_path: Path | None,
                 tracking: TrackingTarget | None = None):  # fmt: skip
        """`tracking`: worker 0's tracking target (spec.tracking), if any."""
        super().__init__(labels={names.LABEL_JOB: job, names.LABEL_RANK: str(rank), names.LABEL_MODE: "paramserver"},
                         port=port, log_path=log_path, tracking=tracking)  # fmt: skip
        # From the first log interval on: none during start-up.
        self.step = LazyGauge(self, names.STEP, "Iterations this worker has completed.")
        self.loss = self.gauge(names.PREFIX + "loss", "Mean training loss over the last log interval.")
        # The series every mode exports (compute, data, exposed = busy communication: pull + push, idle).
        self.times = StepTimeSeries(self, step_doc="Seconds per worker iteration (pull, compute, push).")
        self.pull_s = self.counter(names.PS_PULL_SECONDS, "Seconds in Pull calls (communication).")
        self.push_s = self.counter(names.PS_PUSH_SECONDS, "Seconds in Push calls (communication).")
        self.pull_bytes = self.counter(names.PS_PULL_BYTES, "Parameter bytes received.")
        self.push_bytes = self.counter(names.PS_PUSH_BYTES, "Gradient bytes sent.")

    def observe_iteration(self, step_s: float) -> None:
        """The one per-iteration call: the step-time histogram needs every iteration."""
        self.times.step_time.observe(step_s)

    def observe(self, step: int, t: WorkerTally, *, version: int | None = None) -> None:
        """A log interval's sums (the histogram has had its iterations from observe_iteration);
        `version`: the parameters' version as last pulled from shard 0 (the tracked step)."""
        self.step.set(step)
        self.loss.set(t.loss_sum / max(1, t.steps))
        # Nothing overlaps a pull or a push: exposed = busy = their sum.
        self.times.add(compute_s=t.compute_s, data_s=t.data_s, exposed_s=t.comm_s, busy_s=t.comm_s, idle_s=t.idle_s)
        self.pull_s.inc(t.pull_s)
        self.push_s.inc(t.push_s)
        self.pull_bytes.inc(t.pull_bytes)
        self.push_bytes.inc(t.push_bytes)
        self.write({"step": step, **t.record(), **({"version": version} if version is not None else {})})
