"""Federated series (Prometheus) and the JSON-lines log, for the aggregator and client processes.

The aggregator also exports disttrain_step (= rounds completed),
disttrain_last_checkpoint_step and the time categories of every mode (a round is
its step), so the operator's progress scrape, the launcher's progress bar and the
dashboard read a round where other modes have a step.

With central differential privacy (`private=True`, the aggregator only) the series whose values
come from individual clients are withheld: never registered, so never exported, and their
updates are dropped. They are the clients sampled, answered and dropped (a Poisson sample's size
depends on who takes part), bytes up and down (they count the clients served), each client's
compute and communication seconds, and the round's split into compute, data and communication
(the answered clients' own timings); the round's wall time is still observed.
"""

from __future__ import annotations

from pathlib import Path

from disttrain_api import metric_names as names
from prometheus_client import Counter, Histogram

from ..tracking.tracker import TrackingTarget
from .sink import STEP_BUCKETS, LazyGauge, MetricsSink, StepTimeSeries

ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
AGGREGATOR = "aggregator"  # the process label of the aggregator
ROUND_DOC = "Wall time of one completed round."


class Withheld:
    """A series central DP keeps inside the aggregator: not registered, every update dropped."""

    def inc(self, amount: float = 1.0) -> None:
        del amount

    def observe(self, amount: float) -> None:
        del amount


WITHHELD = Withheld()


class FedMetrics(MetricsSink):
    def __init__(self, *, job: str, process: str, port: int, log_path: Path | None, private: bool = False,
                 tracking: TrackingTarget | None = None):  # fmt: skip
        """`private`: the aggregator of a job with central DP (see the module docstring); it
        tracks (spec.tracking) only what its records release. `tracking`: the aggregator's
        tracking target, if any."""
        labels = {names.LABEL_JOB: job, "process": process, names.LABEL_MODE: "federated"}
        super().__init__(labels=labels, port=port, log_path=log_path, tracking=tracking)
        r, keys = self.registry, tuple(labels)
        gauge, counter = self.gauge, self.counter
        self.private = private and process == AGGREGATOR
        # A counter of values that come from individual clients: withheld with central DP.
        per_client = (lambda name, doc: WITHHELD) if self.private else counter

        # Only the aggregator sees whole rounds; clients export their own series below.
        self.times: StepTimeSeries | None = None
        self.step_time: Histogram | Withheld = WITHHELD
        if process == AGGREGATOR and self.private:
            self.step_time = Histogram(names.STEP_SECONDS, ROUND_DOC, keys, buckets=STEP_BUCKETS,
                                       registry=r).labels(**labels)  # fmt: skip
        elif process == AGGREGATOR:
            self.times = StepTimeSeries(self, step_doc=ROUND_DOC)
        # From the first round (or the round a resumed aggregator restored) on: none during start-up.
        self.step = LazyGauge(self, names.STEP, "Federated rounds completed.")
        self.last_ckpt = gauge(names.LAST_CHECKPOINT_STEP, "Round of the newest checkpoint.")
        self.round = gauge(names.FED_ROUND, "Federated rounds completed.")
        self.round_seconds = Histogram(
            names.FED_ROUND_SECONDS, ROUND_DOC, keys,
            buckets=ROUND_BUCKETS, registry=r,
        ).labels(**labels)  # fmt: skip
        self.sampled = per_client(names.FED_CLIENTS_SAMPLED, "Clients sampled into a round.")
        self.answered = per_client(names.FED_CLIENTS_ANSWERED, "Sampled clients whose update was aggregated.")
        self.dropped = per_client(names.FED_CLIENTS_DROPPED, "Sampled clients that did not answer in time.")
        # Calls and updates refused: about the protocol (with central DP nothing is refused for its
        # content, see aggregator.py), so exported in every case.
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
        self.bytes_up = per_client(names.FED_BYTES_UP, "Bytes of updates on the wire, client to aggregator.")
        self.bytes_down = per_client(names.FED_BYTES_DOWN, "Bytes of global models on the wire, aggregator to client.")
        self.accuracy = gauge(names.FED_ACCURACY, "Test accuracy of the global model after the last round.")
        self.client_compute: Counter | None = None
        self.client_comm: Counter | None = None
        if not self.private:
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
        if self.client_compute is None or self.client_comm is None:
            return  # withheld
        self.client_compute.labels(**self._labels, client=client).inc(compute_s)
        self.client_comm.labels(**self._labels, client=client).inc(comm_s)

    def observe_round(self, *, step_s: float, compute_s: float, data_s: float, comm_s: float, idle_s: float) -> None:
        """The aggregator's round in the time categories of every mode (its communication all exposed);
        with central DP only its wall time."""
        if self.times is not None:
            self.times.observe(step_s=step_s, compute_s=compute_s, data_s=data_s, exposed_s=comm_s, busy_s=comm_s,
                               idle_s=idle_s)  # fmt: skip
        else:
            self.step_time.observe(step_s)
