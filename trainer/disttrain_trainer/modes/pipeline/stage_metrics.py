"""Prometheus series of a pipeline stage, on the rank's own registry (the common labels + stage).

The step-level categories (compute, communication, data) go through the common
`Metrics`; these add what only a pipeline has: the bubble, P2P waits, the
activation memory a stage holds, and the partition plan.
"""

from __future__ import annotations

from typing import Any

from disttrain_api import metric_names as n
from disttrain_api.metric_names import SERIES_LABELS
from prometheus_client import Counter, Gauge

from ...telemetry.step_metrics import Metrics
from .partition import Plan
from .stage_times import StageTimes


class PipelineMetrics:
    def __init__(self, metrics: Metrics, *, stage: int):
        self.enabled = metrics.enabled
        r = metrics.registry
        labels = (*SERIES_LABELS, "stage")
        values = {**metrics.labels, "stage": str(stage)}

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(**values)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**values)

        self.bubble_total = counter(n.PIPE_BUBBLE_SECONDS, "Idle time waiting for another stage's work.")
        self.p2p_total = counter(n.PIPE_P2P_SECONDS, "Waits for activations/gradients in flight (P2P).")
        self.bubble_fraction = gauge(n.PIPE_BUBBLE_FRACTION, "Bubble / pipeline step window, last step.")
        self.step_bubble = gauge(n.PIPE_STEP_BUBBLE_SECONDS, "Bubble seconds of the last step.")
        self.step_p2p = gauge(n.PIPE_STEP_P2P_SECONDS, "P2P wait seconds of the last step.")
        self.step_allreduce = gauge(n.PIPE_STEP_ALLREDUCE_SECONDS,
                                    "Data-parallel gradient all-reduce of this stage, last step.")
        self.act_peak = gauge(n.PIPE_ACTIVATION_PEAK_BYTES, "Peak activation bytes held by this stage, last step.")
        self.plan_seconds = Gauge(n.PIPE_PLAN_STAGE_SECONDS, "Predicted seconds per micro-batch of each stage.",
                                  (*SERIES_LABELS, "plan_stage"), registry=r)
        self.plan_imbalance = gauge(n.PIPE_PLAN_IMBALANCE, "Predicted slowest stage / mean stage.")
        self._base = metrics.labels

    def observe_plan(self, plan: Plan) -> None:
        if not self.enabled:
            return
        for s, t in enumerate(plan.stage_seconds):
            self.plan_seconds.labels(**self._base, plan_stage=str(s)).set(t)
        self.plan_imbalance.set(plan.imbalance)

    def observe_step(self, t: StageTimes, *, p2p_s: float, allreduce_s: float, act_peak_bytes: int) -> None:
        """Idle time (bubble and overhead) goes into the common idle counter through `Metrics`' Tally."""
        if not self.enabled:
            return
        self.bubble_total.inc(t.bubble_s)
        self.p2p_total.inc(p2p_s)
        self.bubble_fraction.set(t.bubble_fraction)
        self.step_bubble.set(t.bubble_s)
        self.step_p2p.set(p2p_s)
        self.step_allreduce.set(allreduce_s)
        self.act_peak.set(act_peak_bytes)
