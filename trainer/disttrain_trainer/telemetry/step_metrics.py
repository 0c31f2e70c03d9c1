"""Per-rank training metrics: Prometheus /metrics and a JSON-lines log with the same figures.

Labels: metric_names.SERIES_LABELS (dtjob/namespace/rank/mode). A step's wall time splits
into data + compute + exposed communication + idle (definitions in disttrain_api.metric_names);
busy communication is reported beside them. The data/tensor loop only records each step's
times (a tuple); they are folded into a `Tally` and the step-time histogram, and the Prometheus
series and the JSON-lines record updated, once per log interval, so the bookkeeping stays off
the per-step path (`fold_steps`). Each rank uses its own CollectorRegistry so several ranks can
share a process in tests without clashing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disttrain_api import constants as C
from disttrain_api import metric_names as names
from disttrain_api.scaling.hint import propose

from ..tracking.tracker import TrackingTarget
from .finish_estimate import FinishEstimate
from .sink import LazyGauge, MetricsSink, StepTimeSeries, time_fractions

# Rank 0 republishes its forecast inputs (and the forecast gauges) at most this often.
FORECAST_PUBLISH_S = 10.0


def ends_interval(step: int, *, log_every: int, steps: int) -> bool:
    """Whether `step` is the last of a log interval (the run's last step ends one too)."""
    return step % log_every == 0 or step == steps


STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(kw_only=True, slots=True)
class Tally:
    """Sums of step figures over an interval or a run (mutable: the loop adds into it every step).

    A step whose communication was not measured (a GPU step the loop did not wait for,
    see modes/data/loop.py) adds its wall time and leaves its work time aside; `settle` splits that
    work into compute and communication in the proportions of the interval's measured steps."""

    steps: int = 0
    samples: int = 0  # this rank's samples
    step_s: float = 0.0
    data_s: float = 0.0
    compute_s: float = 0.0
    exposed_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    measured_work_s: float = 0.0  # work of the steps whose communication was measured
    unmeasured_work_s: float = 0.0  # work not yet split (settle does)

    def add_step(self, *, t0: float, t1: float, t2: float, end: float, exposed_s: float | None,
                 busy_s: float | None, idle_s: float, samples: int) -> None:  # fmt: skip
        """data = t0..t1, work = t1..t2 (compute + exposed communication), idle = rank 0 working
        alone after the step, step = t0..end. Communication is clamped to the work span: a
        collective cannot outlast the backward that waits for it. exposed_s/busy_s None: not
        measured for this step."""
        work = t2 - t1
        self.steps += 1
        self.samples += samples
        self.step_s += end - t0
        self.data_s += t1 - t0
        self.idle_s += idle_s
        if exposed_s is None or busy_s is None:
            self.unmeasured_work_s += work
            return
        exposed = min(exposed_s, work)
        self.compute_s += work - exposed
        self.exposed_s += exposed
        self.busy_s += min(busy_s, work)
        self.measured_work_s += work

    def settle(self) -> None:
        """Split the unmeasured work like the measured work (all compute when nothing was measured)."""
        w = self.unmeasured_work_s
        if w <= 0.0:
            return
        m = self.measured_work_s
        exposed = w * self.exposed_s / m if m > 0 else 0.0
        self.busy_s += w * self.busy_s / m if m > 0 else 0.0
        self.exposed_s += exposed
        self.compute_s += w - exposed
        self.measured_work_s += w
        self.unmeasured_work_s = 0.0

    def merge(self, other: Tally) -> None:
        other.settle()
        self.settle()
        for f in self.__slots__:  # type: ignore[attr-defined]
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def fraction(self, seconds: float) -> float:
        return seconds / self.step_s if self.step_s > 0 else 0.0

    def fractions(self) -> dict[str, float]:
        """The summary's fractions of step time, as every mode reports them (sink.time_fractions)."""
        return time_fractions(step_s=self.step_s, compute_s=self.compute_s, data_s=self.data_s,
                              exposed_s=self.exposed_s, busy_s=self.busy_s, idle_s=self.idle_s)  # fmt: skip

    def record(self) -> dict[str, float]:
        """Per-step means over the tally and the fractions of step time (the JSON-lines fields)."""
        self.settle()
        n = max(1, self.steps)
        return {
            "steps": self.steps,
            "samples_per_s": self.samples / self.step_s if self.step_s > 0 else 0.0,
            "step_s": self.step_s / n,
            "data_s": self.data_s / n,
            "compute_s": self.compute_s / n,
            "comm_exposed_s": self.exposed_s / n,
            "comm_busy_s": self.busy_s / n,
            "idle_s": self.idle_s / n,
            "comm_exposed_fraction": self.fraction(self.exposed_s),
            "comm_busy_fraction": self.fraction(self.busy_s),
            "idle_fraction": self.fraction(self.idle_s),
        }


# One step's raw figures as the loop records them: t0, t1, t2, end, exposed_s, busy_s, idle_s,
# samples (Tally.add_step's arguments), and whether its wall time goes into the histogram.
StepRecord = tuple[float, float, float, float, float | None, float | None, float, int, bool]


def fold_steps(records: list[StepRecord], tally: Tally, metrics: Metrics) -> None:
    """Add the recorded steps into `tally` and the step-time histogram, then forget them.

    The loop appends one tuple per step and folds once per log interval: inside a step a
    Tally update and a histogram observation cost about 7 us of a digits MLP's 0.8 ms step
    (the step's own work has evicted their code and data from the caches; alone they take
    1.3 us), a tuple append next to nothing; folded together they run warm."""
    for t0, t1, t2, end, exposed_s, busy_s, idle_s, samples, timed in records:
        if timed:
            metrics.observe_step_time(end - t0)
        tally.add_step(t0=t0, t1=t1, t2=t2, end=end, exposed_s=exposed_s, busy_s=busy_s, idle_s=idle_s,
                       samples=samples)  # fmt: skip
    records.clear()


class Metrics(MetricsSink):
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
        target_steps: int | None = None,
        tracking: TrackingTarget | None = None,
    ):
        """`target_steps`: the steps the job trains (exported for the dashboard's progress and ETA);
        `tracking`: rank 0's tracking target (spec.tracking), if any."""
        self.enabled = enabled
        labels = {names.LABEL_JOB: job, names.LABEL_NAMESPACE: namespace, names.LABEL_RANK: str(rank),
                  names.LABEL_MODE: mode}  # fmt: skip
        log_path = run_dir / C.RANK_METRICS_FILENAME.format(rank=rank) if enabled and run_dir is not None else None
        super().__init__(labels=labels, port=port if enabled else 0, log_path=log_path,
                         tracking=tracking if enabled else None)  # fmt: skip
        gauge, counter = self.gauge, self.counter
        n = names
        self.times = StepTimeSeries(self, step_doc="Wall time of one optimizer step.", buckets=STEP_BUCKETS, docs={
            n.IDLE_SECONDS: "Time waiting while rank 0 evaluates or snapshots a checkpoint alone.",
            n.COMM_EXPOSED_SECONDS: "Time the step waited on gradient communication no compute overlapped.",
            n.COMM_BUSY_SECONDS: "Time a gradient collective was in flight (overlapped with backward or not).",
        })  # fmt: skip
        self.samples_total = counter(n.SAMPLES, "Training samples processed by this rank.")
        self.grad_bytes_total = counter(n.GRADIENT_BYTES, "Gradient bytes synchronised (before compression).")
        self.compute_step = gauge(n.STEP_COMPUTE_SECONDS, "Compute seconds per step, last log interval.")
        self.data_step = gauge(n.STEP_DATA_SECONDS, "Data-loading seconds per step, last log interval.")
        self.idle_step = gauge(n.STEP_IDLE_SECONDS, "Idle seconds per step, last log interval.")
        self.exposed_step = gauge(n.STEP_COMM_EXPOSED_SECONDS, "Exposed communication seconds per step, last log interval.")
        self.busy_step = gauge(n.STEP_COMM_BUSY_SECONDS, "Busy communication seconds per step, last log interval.")
        self.exposed_fraction = gauge(n.COMM_EXPOSED_FRACTION, "Exposed communication / step time, last log interval.")
        self.busy_fraction = gauge(n.COMM_BUSY_FRACTION, "Busy communication / step time, last log interval.")
        self.idle_fraction = gauge(n.IDLE_FRACTION, "Idle / step time, last log interval.")
        self.samples_per_s = gauge(n.SAMPLES_PER_SECOND, "Samples per second of this rank, last log interval.")
        self.mfu: Any = None  # registered at the first known figure: an unset gauge would read 0
        self.forecast_efficiency: Any = None
        self.forecast_gain: Any = None
        self._forecast_next = float("-inf")
        self.loss = gauge(n.LOSS, "Mean training loss on this rank over the last log interval.")
        self.lr = gauge(n.LEARNING_RATE, "Learning rate of the last step.")
        # Exported from the first log interval on: a scrape during start-up (data preparation) finds
        # no count, so the operator's first rate window starts when training does.
        self.step = LazyGauge(self, n.STEP, "Optimizer steps completed.")
        self.finish = FinishEstimate()
        self.finish_seconds = LazyGauge(self, n.FINISH_SECONDS, "Seconds the run will take after its last step "
                                        "(final evaluation, export, final checkpoint), from what it measured so far.")
        if target_steps is not None:
            gauge(n.TARGET_STEPS, "Optimizer steps the job trains (spec.training.steps).").set(target_steps)
        self.last_ckpt = gauge(n.LAST_CHECKPOINT_STEP, "Step of the newest checkpoint completely written.")
        self.ckpt_stall = gauge(n.CHECKPOINT_STALL_SECONDS, "Seconds the loop paused for the last checkpoint's snapshot.")
        self.ckpt_write = gauge(n.CHECKPOINT_WRITE_SECONDS, "Seconds the last checkpoint's background write took.")
        self.ckpt_bytes = gauge(n.CHECKPOINT_BYTES, "Bytes of the last checkpoint written.")
        self.ckpt_total = counter(n.CHECKPOINTS, "Checkpoints completely written.")
        self.eval_value = gauge(n.EVAL_METRIC, "Last evaluation: test accuracy (classification) or validation loss (text).")  # fmt: skip

    def observe_step_time(self, seconds: float) -> None:
        """The one per-step call: the histogram needs every step."""
        if self.enabled:
            self.times.step_time.observe(seconds)

    def observe_interval(self, *, step: int, loss: float, lr: float, tally: Tally,
                         gradient_bytes: int, extra: dict[str, Any] | None = None,
                         mfu: float | None = None, data_degree: int = 1) -> None:  # fmt: skip
        """The steps since the last log interval: counters grow by their sums, gauges show per-step means.

        `extra`: mode-specific fields added to the JSON-lines record (a pipeline stage's bubble, ...);
        `mfu`: the job's model FLOPs utilisation over the interval, where it is known; `data_degree`:
        the replicas whose samples add up to the job's (the record's job_samples_per_s)."""
        tally.settle()
        if not self.enabled:
            return
        self.times.add(compute_s=tally.compute_s, data_s=tally.data_s, exposed_s=tally.exposed_s, busy_s=tally.busy_s,
                       idle_s=tally.idle_s)  # fmt: skip
        self.samples_total.inc(tally.samples)
        self.grad_bytes_total.inc(gradient_bytes * tally.steps)
        rec = tally.record()
        self.compute_step.set(rec["compute_s"])
        self.data_step.set(rec["data_s"])
        self.idle_step.set(rec["idle_s"])
        self.exposed_step.set(rec["comm_exposed_s"])
        self.busy_step.set(rec["comm_busy_s"])
        self.exposed_fraction.set(rec["comm_exposed_fraction"])
        self.busy_fraction.set(rec["comm_busy_fraction"])
        self.idle_fraction.set(rec["idle_fraction"])
        self.samples_per_s.set(rec["samples_per_s"])
        self.loss.set(loss)
        self.lr.set(lr)
        self.step.set(step)
        finish_s = self.finish.seconds()
        self.finish_seconds.set(finish_s)
        rec["finish_s"] = finish_s
        if mfu is not None:
            if self.mfu is None:
                self.mfu = self.gauge(names.MFU, "Model FLOPs utilisation of the job, last log interval.")
            self.mfu.set(mfu)
            rec["mfu"] = mfu
        self.write({"step": step, "loss": loss, "lr": lr, **rec, "job_samples_per_s": rec["samples_per_s"] * data_degree,
                    "gradient_bytes": gradient_bytes, **(extra or {})})  # fmt: skip

    def forecast_due(self) -> bool:
        """Whether rank 0 should measure and publish its forecast inputs now: at the first steady
        interval, then at most every FORECAST_PUBLISH_S (the operator reads them every few
        seconds; building them each interval of a short-interval run would add to rank 0's
        step, which the other ranks would wait for)."""
        now = time.monotonic()
        if not self.enabled or now < self._forecast_next:
            return False
        self._forecast_next = now + FORECAST_PUBLISH_S
        return True

    def observe_forecast(self, inputs: dict[str, Any]) -> None:
        """Rank 0's forecast inputs as measured so far (summary-shaped: mode, layout, worldSize, ...,
        scaling): served beside /metrics for the operator's hint, and the forecast at the run's own
        size as two gauges for the dashboard. About a millisecond per log interval."""
        if not self.enabled:
            return
        self.publish(names.FORECAST_INPUTS_PATH, inputs)
        p = propose(inputs)
        if p is None:
            return
        if self.forecast_efficiency is None:  # registered at the first figure: an unset gauge would read 0
            self.forecast_efficiency = self.gauge(
                names.FORECAST_EFFICIENCY,
                "Scaling efficiency the forecast (disttrain explain) gives this run's layout at its size: "
                "samples/s over world size x one worker's.")  # fmt: skip
            self.forecast_gain = self.gauge(
                names.FORECAST_GAIN,
                "Samples/s gain the forecast gives the change the operator's hint names (0: none worth one).")
        self.forecast_efficiency.set(p.efficiency)
        self.forecast_gain.set(p.gain)

    def observe_checkpoint_stall(self, step: int, seconds: float) -> None:
        if not self.enabled:
            return
        self.ckpt_stall.set(seconds)
        self.finish.checkpoint_stall_s = seconds
        self.write({"event": "checkpoint_stall", "step": step, "stall_s": seconds})

    def observe_checkpoint(self, step: int, write_s: float, nbytes: int) -> None:
        """A checkpoint is completely on disk (rank 0, when its background write finished)."""
        if not self.enabled:
            return
        self.last_ckpt.set(step)
        self.ckpt_write.set(write_s)
        self.ckpt_bytes.set(nbytes)
        self.ckpt_total.inc()
        self.finish.checkpoint_write_s, self.finish.checkpoint_bytes = write_s, nbytes
        self.write({"event": "checkpoint", "step": step, "write_s": write_s, "checkpoint_bytes": nbytes})

    def observe_eval(self, step: int, name: str, value: float, seconds: float | None = None) -> None:
        """An evaluation's result and, where timed, how long it took (`eval_s`)."""
        if not self.enabled:
            return
        self.eval_value.set(value)
        if seconds is not None:
            self.finish.eval_s, self.finish.eval_timed = seconds, True
        self.write({"event": "eval", "step": step, name: value, **({"eval_s": seconds} if seconds is not None else {})})


def observe_single_step(m: Metrics, *, step: int, loss: float, lr: float, samples: int, t0: float, t1: float,
                        t2: float, end: float, comm_s: float, comm_bytes: int) -> None:  # fmt: skip
    """One step observed as its own log interval, communication not overlapped (exposed = busy):
    for tools and tests that feed Metrics without the training loop."""
    t = Tally()
    fold_steps([(t0, t1, t2, end, comm_s, comm_s, 0.0, samples, True)], t, m)
    m.observe_interval(step=step, loss=loss, lr=lr, tally=t, gradient_bytes=comm_bytes)
