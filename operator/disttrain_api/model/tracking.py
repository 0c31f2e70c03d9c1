"""spec.tracking: experiment tracking of the job's metrics (TensorBoard event files, an MLflow run)."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import fld
from .vocabulary import TRACKING_URI_PATTERN


@dataclass(frozen=True, kw_only=True)
class MlflowSpec:
    uri: str = fld(
        pattern=TRACKING_URI_PATTERN,
        desc="The MLflow tracking server, http(s)://host[:port][/path], reachable from the job's pods; its "
        "artifact store receives the exported model (run the server with artifact serving, its default).",
    )
    experiment: str | None = fld(
        None,
        desc="Experiment the run is logged under (created when missing); empty: the job's namespace/name.",
    )
    timeout_seconds: int = fld(
        10, minimum=1, maximum=300,
        desc="Longest one request to the server may take. A request is tried 3 times; the run's end waits at "
        "most 3 x this for the last records before it leaves without them.",
    )


@dataclass(frozen=True, kw_only=True)
class TrackingSpec:
    tensorboard: bool = fld(
        False,
        desc="Write TensorBoard event files of the tracked process's scalars under <checkpoint path>/"
        "tensorboard (read them with tensorboard --logdir on the volume).",
    )
    mlflow: MlflowSpec | None = fld(
        None,
        desc="Log the job to an MLflow tracking server: the spec as parameters, the metrics with their steps, "
        "the summary and the exported model. Server errors never fail training: they are retried, then "
        "counted (disttrain_tracking_errors_total) and logged.",
    )
