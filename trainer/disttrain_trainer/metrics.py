"""Per-rank training metrics: Prometheus /metrics and a JSON-lines log with the same figures.

Series (prefix disttrain_, labels dtjob/namespace/rank/mode: metric_names.SERIES_LABELS):
step time histogram; compute, communication and data-loading seconds as counters (_total) and per-step
gauges; samples/s; loss; step; last checkpoint step; checkpoint seconds and
bytes; communication fraction (comm / step time), the headline number of the
scaling problem. Each rank uses its own CollectorRegistry so several ranks can
share a process in tests without clashing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from disttrain_api import metric_names as names
from disttrain_api.metric_names import PREFIX as P
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, kw_only=True)
class StepStats:
    step: int
    loss: float
    lr: float
    samples_per_s: float
    step_s: float
    compute_s: float
    comm_s: float
    data_s: float
    comm_fraction: float
    comm_bytes: int

    @classmethod
    def from_times(
        cls, *, step: int, loss: float, lr: float, samples: int, t0: float, t1: float, t2: float,
        end: float, comm_s: float, comm_bytes: int,
    ) -> StepStats:
        """One step's split: data = t0..t1, work = t1..t2 (compute + the communication measured
        inside it), step = t0..end (bookkeeping included). Communication is clamped to the work
        span: a collective still in flight after the step returned is not part of this step."""
        comm_s = min(comm_s, t2 - t1)
        step_s = end - t0
        return cls(
            step=step, loss=loss, lr=lr, samples_per_s=samples / step_s, step_s=step_s,
            compute_s=(t2 - t1) - comm_s, comm_s=comm_s, data_s=t1 - t0,
            comm_fraction=comm_s / step_s, comm_bytes=comm_bytes,
        )  # fmt: skip


class Metrics:
    def __init__(
        self,
        *,
        job: str,
        rank: int,
        mode: str,
        port: int,
        run_dir: Path | None,
        enabled: bool = True,
        namespace: str = "default",
    ):
        self.enabled = enabled
        self.registry = CollectorRegistry()
        labels = names.SERIES_LABELS
        self._values = {names.LABEL_JOB: job, names.LABEL_NAMESPACE: namespace, names.LABEL_RANK: str(rank),
                        names.LABEL_MODE: mode}  # fmt: skip
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(P + name, doc, labels, registry=r).labels(**self._values)

        def counter(name: str, doc: str) -> Any:
            return Counter(P + name, doc, labels, registry=r).labels(**self._values)

        self.step_time = Histogram(P + "step_seconds", "Wall time of one optimizer step.", labels,
                                   buckets=STEP_BUCKETS, registry=r).labels(**self._values)  # fmt: skip
        self.compute_total = counter(
            "compute_seconds", "Step time not spent loading data or communicating."
        )
        self.comm_total = counter(
            "communication_seconds", "Time with a gradient collective in flight (measured)."
        )
        self.data_total = counter("data_seconds", "Time spent loading and moving batches.")
        self.samples_total = counter("samples", "Training samples processed by this rank.")
        self.comm_bytes_total = counter(
            "communication_bytes", "Gradient bytes handed to collectives."
        )
        self.compute_step = gauge("step_compute_seconds", "Compute seconds of the last step.")
        self.comm_step = gauge(
            "step_communication_seconds", "Communication seconds of the last step."
        )
        self.data_step = gauge("step_data_seconds", "Data-loading seconds of the last step.")
        self.samples_per_s = gauge(
            "samples_per_second", "Samples per second of this rank in the last step."
        )
        self.loss = gauge("loss", "Training loss of the last step on this rank.")
        self.lr = gauge("learning_rate", "Learning rate of the last step.")
        self.step = Gauge(names.STEP, "Optimizer steps completed.", labels, registry=r).labels(**self._values)
        self.comm_fraction = gauge(
            "communication_fraction", "Communication seconds / step seconds, last step."
        )
        self.last_ckpt = Gauge(names.LAST_CHECKPOINT_STEP, "Step of the newest checkpoint written.", labels,
                               registry=r).labels(**self._values)
        self.ckpt_seconds = gauge("checkpoint_seconds", "Seconds the last checkpoint took.")
        self.ckpt_bytes = gauge("checkpoint_bytes", "Bytes of the last checkpoint.")
        self.ckpt_total = counter("checkpoints", "Checkpoints written.")
        self.eval_value = gauge(
            "eval_metric",
            "Last evaluation: test accuracy (classification) or validation loss (text).",
        )
        self._server: Any = None
        self._log = None
        if enabled and port:
            self._server, _ = start_http_server(port, registry=r)
        if enabled and run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._log = open(run_dir / f"metrics-rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    def observe_step(self, s: StepStats, *, log: bool) -> None:
        if not self.enabled:
            return
        self.step_time.observe(s.step_s)
        self.compute_total.inc(s.compute_s)
        self.comm_total.inc(s.comm_s)
        self.data_total.inc(s.data_s)
        self.samples_total.inc(s.samples_per_s * s.step_s)
        self.comm_bytes_total.inc(s.comm_bytes)
        self.compute_step.set(s.compute_s)
        self.comm_step.set(s.comm_s)
        self.data_step.set(s.data_s)
        self.samples_per_s.set(s.samples_per_s)
        self.loss.set(s.loss)
        self.lr.set(s.lr)
        self.step.set(s.step)
        self.comm_fraction.set(s.comm_fraction)
        if log:
            self.write({**asdict(s), "time": time.time()})

    def observe_checkpoint(self, step: int, seconds: float, nbytes: int) -> None:
        if not self.enabled:
            return
        self.last_ckpt.set(step)
        self.ckpt_seconds.set(seconds)
        self.ckpt_bytes.set(nbytes)
        self.ckpt_total.inc()
        self.write({"event": "checkpoint", "step": step, "checkpoint_s": seconds, "checkpoint_bytes": nbytes,
                    "time": time.time()})  # fmt: skip

    def observe_eval(self, step: int, name: str, value: float) -> None:
        if not self.enabled:
            return
        self.eval_value.set(value)
        self.write({"event": "eval", "step": step, name: value, "time": time.time()})

    def write(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
