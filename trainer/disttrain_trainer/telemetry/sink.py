"""One process's Prometheus registry, its optional /metrics server and its JSON-lines log,
and the time categories every mode exports under the same names.

Every process owns one: a rank of the data and pipeline modes (step_metrics.Metrics), the
federated aggregator and client processes (federated_series.py), the parameter-server shards
and workers (paramserver_series.py). All of them export the time categories through
`StepTimeSeries`.

The job's tracking process (rank 0, the federated aggregator, parameter-server worker 0) opens its
sink with a tracking target (spec.tracking): every record the sink logs then also goes to
TensorBoard and MLflow (disttrain_trainer.tracking), from this one place for every mode.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from disttrain_api import metric_names as names
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from ..tracking.tracker import Tracker, TrackingTarget

# Paths a process may publish a document at (`MetricsSink.publish`): 404 until it does.
DOCUMENT_PATHS = (names.FORECAST_INPUTS_PATH,)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a hung scraper never holds the process at exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log: a scrape every few seconds is not news."""


class MetricsSink:
    """Registry, optional /metrics server and optional JSON-lines log of one process.

    The server also answers the paths `publish` was given (JSON documents the operator reads
    beside the metrics, e.g. the forecast inputs); every other path is prometheus-client's."""

    def __init__(self, *, labels: dict[str, str], port: int, log_path: Path | None,
                 tracking: TrackingTarget | None = None):  # fmt: skip
        """`tracking`: given to the job's tracking process only (see the module's doc)."""
        self.registry = CollectorRegistry()
        self.labels = labels
        self.tracker: Tracker | None = None
        self._summary: dict[str, Any] | None = None
        self._server: Any = None
        self._documents: dict[str, bytes] = {}
        self._doc_lock = threading.Lock()
        if port:
            self._server = make_server("0.0.0.0", port, self._app(make_wsgi_app(self.registry)), _Server,  # noqa: S104 - pods are scraped on their IP
                                       handler_class=_Quiet)  # fmt: skip
            threading.Thread(target=self._server.serve_forever, name="metrics-server", daemon=True).start()
        self._log = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "a", buffering=1)  # noqa: SIM115
        if tracking is not None:
            errors = Counter(names.TRACKING_ERRORS, "Tracking records not delivered (after retries) or dropped, "
                             "by backend; training went on.", (*labels, names.LABEL_TRACKING_BACKEND),
                             registry=self.registry)  # fmt: skip
            self.tracker = Tracker(tracking, on_error=lambda backend, n: errors.labels(**labels, backend=backend).inc(n))

    def gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, tuple(self.labels), registry=self.registry).labels(**self.labels)

    def counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, tuple(self.labels), registry=self.registry).labels(**self.labels)

    def _app(self, metrics: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with self._doc_lock:
                doc = self._documents.get(environ.get("PATH_INFO", ""))
            if doc is None and environ.get("PATH_INFO") in DOCUMENT_PATHS:
                start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "0")])
                return [b""]  # not published yet (or not by this process): never the metrics instead
            if doc is None:
                return metrics(environ, start_response)
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(doc)))])
            return [doc]

        return app

    def publish(self, path: str, document: dict[str, Any]) -> None:
        """Serve `document` as JSON at `path` from now on (replacing what was there)."""
        body = json.dumps(document, sort_keys=True).encode()
        with self._doc_lock:
            self._documents[path] = body

    def write(self, record: dict[str, Any]) -> None:
        """One record into the JSON-lines log and, in the tracking process, to the trackers."""
        stamped = {**record, "time": time.time()}
        if self._log is not None:
            self._log.write(json.dumps(stamped) + "\n")
        if self.tracker is not None:
            self.tracker.record(stamped)

    def finished(self, summary: dict[str, Any]) -> None:
        """The run's summary: the trackers log it (and the exported model it names) at `close`."""
        self._summary = summary

    def close(self) -> None:
        if self.tracker is not None:
            tracker, self.tracker = self.tracker, None
            errors = tracker.close(self._summary)
            if any(errors.values()):
                self.write({"event": "tracking_errors", **errors})
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class LazyGauge:
    """A gauge registered on the sink at its first `set`: until then a scrape finds no series, where
    a plain gauge would read 0 (a step count of 0 during start-up would anchor a rate window)."""

    def __init__(self, sink: MetricsSink, name: str, doc: str) -> None:
        self._sink, self._name, self._doc = sink, name, doc
        self._gauge: Any = None

    def set(self, value: float) -> None:
        if self._gauge is None:
            self._gauge = self._sink.gauge(self._name, self._doc)
        self._gauge.set(value)


class StepTimeSeries:
    """Where a step's wall time went, in the series every mode exports (disttrain_api.metric_names):
    the step-time histogram and the compute, data, exposed and busy communication and idle
    counters, so one dashboard reads every mode. A mode whose "step" is a round or an
    iteration (federated, parameter server) observes one of those per step."""

    DOCS = {
        names.COMPUTE_SECONDS: "Step time computing (not data, not exposed communication, not idle).",
        names.DATA_SECONDS: "Time spent loading and moving batches.",
        names.IDLE_SECONDS: "Time waiting while another process works alone.",
        names.COMM_EXPOSED_SECONDS: "Time the step waited on communication nothing overlapped.",
        names.COMM_BUSY_SECONDS: "Time communication was in flight (overlapped or not).",
    }

    def __init__(self, sink: MetricsSink, *, step_doc: str, buckets: tuple[float, ...] = STEP_BUCKETS,
                 docs: Mapping[str, str] | None = None):  # fmt: skip
        """`docs`: a mode's own wording of a series' help text (series name -> text)."""
        n, doc = names, {**self.DOCS, **(docs or {})}
        self.step_time = Histogram(n.STEP_SECONDS, step_doc, tuple(sink.labels), buckets=buckets,
                                   registry=sink.registry).labels(**sink.labels)  # fmt: skip
        self.compute = sink.counter(n.COMPUTE_SECONDS, doc[n.COMPUTE_SECONDS])
        self.data = sink.counter(n.DATA_SECONDS, doc[n.DATA_SECONDS])
        self.idle = sink.counter(n.IDLE_SECONDS, doc[n.IDLE_SECONDS])
        self.exposed = sink.counter(n.COMM_EXPOSED_SECONDS, doc[n.COMM_EXPOSED_SECONDS])
        self.busy = sink.counter(n.COMM_BUSY_SECONDS, doc[n.COMM_BUSY_SECONDS])

    def observe(self, *, step_s: float, compute_s: float, data_s: float, exposed_s: float, busy_s: float,
                idle_s: float) -> None:  # fmt: skip
        """One step: its time into the histogram, its parts into the counters."""
        self.step_time.observe(step_s)
        self.add(compute_s=compute_s, data_s=data_s, exposed_s=exposed_s, busy_s=busy_s, idle_s=idle_s)

    def add(self, *, compute_s: float, data_s: float, exposed_s: float, busy_s: float, idle_s: float) -> None:
        """The counters only: for a mode that sums its parts over a log interval and feeds the
        histogram every step itself (`step_time.observe`)."""
        self.compute.inc(compute_s)
        self.data.inc(data_s)
        self.idle.inc(idle_s)
        self.exposed.inc(exposed_s)
        self.busy.inc(busy_s)


def time_fractions(*, step_s: float, compute_s: float, data_s: float, exposed_s: float, busy_s: float,
                   idle_s: float) -> dict[str, float]:  # fmt: skip
    """The summary's fractions of step time, in the API's camelCase, as every mode reports them:
    compute + exposed communication + data + idle = 1; busy communication overlaps compute."""

    def frac(seconds: float) -> float:
        return seconds / step_s if step_s > 0 else 0.0

    return {
        "computeFraction": frac(compute_s),
        "commExposedFraction": frac(exposed_s),
        "commFraction": frac(exposed_s),  # = exposed: what status.commFraction shows
        "commBusyFraction": frac(busy_s),
        "dataFraction": frac(data_s),
        "idleFraction": frac(idle_s),
    }
