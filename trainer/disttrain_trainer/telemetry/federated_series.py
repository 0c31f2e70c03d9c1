"""Federated series (Prometheus) and the JSON-lines log, for the aggregator and client processes.

The aggregator also exports disttrain_step (= rounds completed),
disttrain_last_checkpoint_step and the time categories of every mode (a round is
its step), so the operator's progress scrape, the launcher's progress bar and the
dashboard read a round where other modes have a step.
"""

from __future__ import annotations

from pathlib import Path

from disttrain_api import metric_names as names
from prometheus_client import Counter, Histogram

from ..tracking.tracker import TrackingTarget
from .sink import LazyGauge, MetricsSink, StepTimeSeries

ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
AGGREGATOR = "aggregator"  # the process label of the aggregator


class FedMetrics(MetricsSink):
    def __init__(self, *, job: str, process: str, port: int, log_path: Path | None,
                 tracking: TrackingTarget | None = None):  # fmt: skip
        """`tracking`: the aggregator's tracking target (spec.tracking), if any."""
        labels = {names.LABEL_JOB: job, "process": process, names.LABEL_MODE: "federated"}
        super().__init__(labels=labels, port=port, log_path=log_path, tracking=tracking)
        r, keys = self.registry, tuple(labels)
        gauge, counter = self.gauge, self.counter

        # Only the aggregator sees whole rounds; clients export their own series below.
        self.times = StepTimeSeries(self, step_doc="Wall time of one completed round.") if process == AGGREGATOR else None
        # From the first round (or the round a resumed aggregator restored) on: none during start-up.
        self.step = LazyGauge(self, names.STEP, "Federated rounds completed.")
        self.last_ckpt = gauge(names.LAST_CHECKPOINT_STEP, "Round of the newest checkpoint.")
        self.round = gauge(names.FED_ROUND, "Federated rounds completed.")
        self.round_seconds = Histogram(
            names.FED_ROUND_SECONDS, "Wall time of one completed round.", keys,
            buckets=ROUND_BUCKETS, registry=r,
        ).labels(**labels)  # fmt: skip
        self.sampled = counter(names.FED_CLIENTS_SAMPLED, "Clients sampled into a round.")
        self.answered = counter(names.FED_CLIENTS_ANSWERED, "Sampled clients whose update was aggregated.")
        self.dropped = counter(names.FED_CLIENTS_DROPPED, "Sampled clients that did not answer in time.")
        self.rejected = Counter(
            names.FED_UPDATES_REJECTED, "Calls or updates refused, by reason.", (*keys, "reason"), registry=r
        )
        self._labels = labels
        self.retries = counter(names.FED_ROUND_RETRIES, "Round attempts abandoned and sampled again.")
        self.abandoned = Counter(
            names.FED_ROUNDS_ABANDONED, "Round attempts not published (the model untouched), by reason.",
            (*keys, "reason"), registry=r,
        )  # fmt: skip
        self.epsilon = gauge(names.FED_PRIVACY_EPSILON, "Central DP: epsilon spent so far at the spec's delta.")
        self.bytes_up = counter(names.FED_BYTES_UP, "Bytes of updates on the wire, client to aggregator.")
        self.bytes_down = counter(names.FED_BYTES_DOWN, "Bytes of global models on the wire, aggregator to client.")
        self.accuracy = gauge(names.FED_ACCURACY, "Test accuracy of the global model after the last round.")
        self.client_compute = Counter(
            names.FED_CLIENT_COMPUTE_SECONDS, "Local training seconds, per client.", (*keys, "client"), registry=r
        )
        self.client_comm = Counter(
            names.FED_CLIENT_COMM_SECONDS, "Seconds receiving the model and sending the update, per client.",
            (*keys, "client"), registry=r,
        )  # fmt: skip

    def reject(self, reason: str) -> None:
        self.rejected.labels(**self._labels, reason=reason).inc()

    def rejected_count(self, reason: str) -> float:
        return self.rejected.labels(**self._labels, reason=reason)._value.get()

    def abandon(self, reason: str) -> None:
        self.abandoned.labels(**self._labels, reason=reason).inc()

    def abandoned_count(self, reason: str) -> float:
        return self.abandoned.labels(**self._labels, reason=reason)._value.get()

    def client_times(self, client: str, compute_s: float, comm_s: float) -> None:
        self.client_compute.labels(**self._labels, client=client).inc(compute_s)
        self.client_comm.labels(**self._labels, client=client).inc(comm_s)
