"""What a tracked record says, as tracking tags: one mapping from the JSON-lines fields every mode
writes (telemetry/) to the tags TensorBoard and MLflow show, and the spec as flat parameters."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

# JSON-lines field -> tag. The time categories are seconds per step (a round, an iteration) over
# the log interval, as the record gives them.
SERIES = {
    "loss": "train/loss",
    "lr": "train/learning_rate",
    "samples_per_s": "train/samples_per_second",  # a process's own (a federated round's: the job's)
    "job_samples_per_s": "train/samples_per_second",  # a collective rank's record: the whole job's (wins)
    "mfu": "train/mfu",
    "step_s": "time/step_seconds",
    "compute_s": "time/compute_seconds",
    "comm_exposed_s": "time/comm_exposed_seconds",
    "comm_busy_s": "time/comm_busy_seconds",
    "data_s": "time/data_seconds",
    "idle_s": "time/idle_seconds",
    # Evaluation results (run_common.evaluate's names): an eval event's, or a federated round's.
    "test_accuracy": "eval/test_accuracy",
    "val_loss": "eval/val_loss",
    # Federated rounds.
    "clients_sampled": "federated/clients_sampled",
    "clients_answered": "federated/clients_answered",
    "clients_dropped": "federated/clients_dropped",
    "bytes_up": "federated/bytes_up",
    "bytes_down": "federated/bytes_down",
    "epsilon": "federated/privacy_epsilon",
}
# Events (a record's "event" field) -> their own fields' tags; the fields above apply too.
EVENTS = {
    "checkpoint": {"write_s": "checkpoint/write_seconds", "checkpoint_bytes": "checkpoint/bytes"},
    "checkpoint_stall": {"stall_s": "checkpoint/stall_seconds"},
    "eval": {"eval_s": "eval/seconds"},
}
# Events of processes that are not the job's view (a federated client's round): never tracked.
IGNORED_EVENTS = ("client_round",)
# The field a record's step is read from, first found: a parameter-server record carries the
# parameters' version (updates shard 0 applied), which is that mode's step; every other record
# its step (a round in federated mode).
STEP_FIELDS = ("version", "step")
SUMMARY_PREFIX = "summary/"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def step_of(record: Mapping[str, Any]) -> int | None:
    for key in STEP_FIELDS:
        value = _number(record.get(key))
        if value is not None:
            return int(value)
    return None


def scalars_of(record: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
    """(step, {tag: value}) of one JSON-lines record; None when it has no step or nothing tracked."""
    event = record.get("event")
    if event in IGNORED_EVENTS:
        return None
    step = step_of(record)
    if step is None:
        return None
    table = {**SERIES, **EVENTS.get(str(event), {})} if event is not None else SERIES
    values = {tag: v for key, tag in table.items() if (v := _number(record.get(key))) is not None}
    return (step, values) if values else None


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """The summary's top-level numbers (finalLoss, testAccuracy, samplesPerS, the fractions, ...)."""
    return {SUMMARY_PREFIX + k: v for k, raw in summary.items() if (v := _number(raw)) is not None}


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A JSON document as dotted keys (`training.steps`) and string values; a list is one JSON value."""
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list | tuple):
        return {prefix: json.dumps(value, sort_keys=True)}
    return {prefix: "" if value is None else str(value)}
