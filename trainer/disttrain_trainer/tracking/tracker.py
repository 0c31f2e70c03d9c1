"""The tracking process's `Tracker`: every record its metrics sink logs, as scalars for each backend
spec.tracking turns on, and the run's end (summary, exported model).

`target_for(cfg)` is what a mode's tracking process hands its sink (telemetry/sink.py); the
sink opens the Tracker, feeds it `record`, and `close`s it with the summary.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disttrain_api import constants as C
from disttrain_api.model import JobSpec, to_json

from ..process.config import TrainerConfig
from .background import BackgroundWriter, Final, Scalars
from .mlflow_backend import ATTEMPTS, MlflowBackend, client_environment
from .scalars import flatten, scalars_of
from .tensorboard_backend import TensorBoardBackend

TENSORBOARD_DIRNAME = "tensorboard"  # under the checkpoint directory
STATE_DIRNAME = "tracking"  # under the checkpoint directory: the MLflow run's id
# The run's end waits this long for the event files to reach the disk.
TENSORBOARD_CLOSE_S = 30.0


@dataclass(frozen=True, kw_only=True)
class TrackingTarget:
    """What the tracking process needs to know about its job (from TrainerConfig, parsed once)."""

    spec: JobSpec
    job: str
    namespace: str
    checkpoint_dir: Path
    restart_attempt: int = 0

    @property
    def tensorboard_dir(self) -> Path:
        return self.checkpoint_dir / TENSORBOARD_DIRNAME


def target_for(cfg: TrainerConfig) -> TrackingTarget | None:
    """The job's tracking target, None when spec.tracking turns nothing on."""
    t = cfg.spec.tracking
    if not t.tensorboard and t.mlflow is None:
        return None
    return TrackingTarget(spec=cfg.spec, job=cfg.job, namespace=cfg.namespace, checkpoint_dir=cfg.checkpoint_dir,
                          restart_attempt=cfg.restart_attempt)  # fmt: skip


def params_of(target: TrackingTarget) -> dict[str, str]:
    """The job's parameters: the whole spec, flattened (`training.steps`), with the job's name."""
    return {"job": target.job, "namespace": target.namespace, **flatten(to_json(target.spec))}


class Tracker:
    def __init__(self, target: TrackingTarget, *, on_error: Callable[[str, int], None],
                 log: Callable[[str], None] = lambda s: print(s, flush=True)) -> None:  # fmt: skip
        """`on_error(backend, n)`: n records that backend could not deliver (the sink's counter)."""
        self.target = target
        self.last_step = 0
        self.writers: list[BackgroundWriter] = []
        spec = target.spec.tracking

        def counted(name: str) -> Callable[[int], None]:
            return lambda n: on_error(name, n)

        if spec.tensorboard:
            tb = TensorBoardBackend(target.tensorboard_dir)
            self.writers.append(BackgroundWriter(tb, on_error=counted(tb.name), log=log))
        if spec.mlflow is not None:
            os.environ.update(client_environment(spec.mlflow))
            ml = MlflowBackend(spec.mlflow, experiment=spec.mlflow.experiment or f"{target.namespace}/{target.job}",
                               run_name=target.job, params=params_of(target), state_dir=target.checkpoint_dir / STATE_DIRNAME,
                               tags={"disttrain.job": target.job, "disttrain.namespace": target.namespace,
                                     "disttrain.mode": target.spec.mode})  # fmt: skip
            self.writers.append(BackgroundWriter(ml, on_error=counted(ml.name), log=log))

    def record(self, record: Mapping[str, Any]) -> None:
        """One JSON-lines record of the sink (with its "time"): queued, never waited for."""
        found = scalars_of(record)
        if found is None:
            return
        step, values = found
        self.last_step = max(self.last_step, step)
        item = Scalars(step=step, values=values, wall_time=float(record.get("time") or time.time()))
        for w in self.writers:
            w.put(item)

    def close(self, summary: dict[str, Any] | None) -> dict[str, int]:
        """The run's end (`summary` None: it did not finish): each backend gets a bounded time to
        deliver what is queued. Returns the records each could not deliver."""
        export = self.target.checkpoint_dir / C.EXPORT_DIRNAME
        has_export = summary is not None and summary.get("export") is not None and export.is_dir()
        # A finished run resumed logs no record: its summary's steps are its last step.
        step = self.last_step or int((summary or {}).get("steps") or 0)
        final = Final(summary=summary, step=step, export_dir=str(export) if has_export else None)
        mlflow = self.target.spec.tracking.mlflow
        errors = {}
        for w in self.writers:
            budget = TENSORBOARD_CLOSE_S if w.backend.name == TensorBoardBackend.name else (
                ATTEMPTS * mlflow.timeout_seconds if mlflow else 0.0)  # fmt: skip
            errors[w.backend.name] = w.close(final, budget)
        return errors
