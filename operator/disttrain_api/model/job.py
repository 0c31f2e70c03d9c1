"""The job: its spec (JobSpec, with every sub-spec), metadata and the whole DistTrainJob, and their
parsing (schema-level rules; the cross-field rules are validation.py's)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from ..dataparse import FieldError, SpecError, describe, fld, parse_dataclass
from .fault_tolerance import FaultToleranceSpec
from .federated import FederatedSpec
from .object_store import ObjectStoreSpec
from .paramserver import ParamServerSpec
from .run_policy import RunPolicy
from .tracking import TrackingSpec
from .training import (
    CheckpointSpec,
    DataSpec,
    ElasticSpec,
    ModelSpec,
    OptimizerSpec,
    Parallelism,
    TrainingSpec,
)
from .vocabulary import API_VERSION, JOB_NAME_PATTERN, KIND, MAX_JOB_NAME, TOP_LEVEL_FIELDS, Mode
from .workers import Workers


@dataclass(frozen=True, kw_only=True)
class MetricsSpec:
    port: int = fld(9400, minimum=1024, maximum=65535, desc="Rank r serves /metrics on port + local rank.")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    mode: Mode = fld("data", desc="Parallel mode.")
    image: str | None = fld(None, desc="Trainer image; default from the operator's settings.")
    workers: Workers = fld(factory=Workers, desc="The worker pods (the gang).")
    parallelism: Parallelism = fld(
        factory=Parallelism,
        desc="Degrees: the data-parallel degree is the world size / (tensor x pipeline).",
    )
    model: ModelSpec = fld(factory=ModelSpec, desc="The network to train.")
    data: DataSpec = fld(factory=DataSpec, desc="Dataset and global batch.")
    optimizer: OptimizerSpec = fld(factory=OptimizerSpec, desc="Optimizer and learning-rate schedule.")
    training: TrainingSpec = fld(factory=TrainingSpec, desc="Steps, precision, memory and communication savers.")
    checkpoint: CheckpointSpec = fld(factory=CheckpointSpec, desc="Where and how often to checkpoint.")
    object_store: ObjectStoreSpec | None = fld(
        None, desc="Endpoint, region and credentials for s3:// URIs in spec.data.path and spec.checkpoint.uri."
    )
    elastic: ElasticSpec | None = fld(None, desc="Shrink a gang that cannot be scheduled at full size.")
    fault_tolerance: FaultToleranceSpec | None = fld(
        None,
        desc="Mode data: keep training through the failure of a replica (a worker pod) instead of restarting "
        "the gang; the failed replica is replaced alone and recovers from a live peer.",
    )
    federated: FederatedSpec | None = fld(None, desc="Only in federated mode.")
    param_server: ParamServerSpec | None = fld(None, json="paramServer", desc="Only in paramserver mode.")
    run_policy: RunPolicy = fld(factory=RunPolicy, desc="Restarts, deadlines, cleanup, suspension.")
    metrics: MetricsSpec = fld(factory=MetricsSpec, desc="Prometheus endpoint of each rank.")
    tracking: TrackingSpec = fld(
        factory=TrackingSpec,
        desc="Experiment tracking (TensorBoard, MLflow) by the process that sees the whole job: rank 0, the "
        "federated aggregator, parameter-server worker 0.",
    )

    @property
    def world_size(self) -> int:
        return self.workers.replicas * self.workers.procs_per_worker

    @property
    def fault_tolerant(self) -> bool:
        """Whether each worker pod is a fault-tolerant replica group (spec.faultTolerance enabled)."""
        return self.fault_tolerance is not None and self.fault_tolerance.enabled

    @property
    def data_degree(self) -> int:
        return self.world_size // (self.parallelism.tensor * self.parallelism.pipeline)


@dataclass(frozen=True, kw_only=True)
class Metadata:
    name: str = fld(desc="Job name: a DNS-1035 label (starts with a letter) of at most 45 characters.")
    namespace: str = fld("default")


@dataclass(frozen=True, kw_only=True)
class DistTrainJob:
    metadata: Metadata
    spec: JobSpec


def _complete_spec(spec: JobSpec) -> JobSpec:
    # The mode's own block may be omitted: it then means "all defaults". Filling it
    # here gives consumers (operator, trainer) a non-None block in that mode.
    if spec.mode == "federated" and spec.federated is None:
        spec = replace(spec, federated=FederatedSpec())
    if spec.mode == "paramserver" and spec.param_server is None:
        spec = replace(spec, param_server=ParamServerSpec())
    return spec


def parse_spec(data: Any, path: str = "spec") -> JobSpec:
    """Parse and range-check a spec (schema-level rules only). Raises SpecError."""
    errors: list[FieldError] = []
    spec = _complete_spec(parse_dataclass(JobSpec, data, path, errors))
    if errors:
        raise SpecError(errors)
    return spec


def _parse_metadata(meta: Any, errors: list[FieldError]) -> Metadata:
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        errors.append(FieldError("metadata", f"expected an object, got {describe(meta)}"))
        return Metadata(name="invalid")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        errors.append(FieldError("metadata.name", "required field is missing"))
        name = "invalid"
    elif not re.match(JOB_NAME_PATTERN, name) or len(name) > MAX_JOB_NAME:
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter and "
                f"ending with a letter or digit) of at most {MAX_JOB_NAME} characters: it names the job's Service "
                "and pods",
            )
        )
    return Metadata(name=name, namespace=str(meta.get("namespace") or "default"))


def parse_job_partial(obj: Any) -> tuple[DistTrainJob, list[FieldError]]:
    """Parse a whole manifest with schema rules, never raising for bad input.

    Returns a best-effort job (wrong values replaced by defaults) and every schema
    error; `validation.check_job` runs the cross-field rules on that job, skipping
    rules whose inputs had errors.
    """
    errors: list[FieldError] = []
    if not isinstance(obj, dict):
        # Nothing else can be said about a document that is not a mapping.
        errors.append(FieldError("(document)", f"expected a DistTrainJob object, got {describe(obj)}"))
        return DistTrainJob(metadata=Metadata(name="invalid"), spec=_complete_spec(JobSpec())), errors
    for key in obj:
        if key not in TOP_LEVEL_FIELDS:
            errors.append(FieldError(str(key), f"unknown field (known fields: {', '.join(TOP_LEVEL_FIELDS)})"))
    if obj.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"{obj.get('apiVersion')!r} must be {API_VERSION}"))
    if obj.get("kind") != KIND:
        errors.append(FieldError("kind", f"{obj.get('kind')!r} must be {KIND}"))
    metadata = _parse_metadata(obj.get("metadata"), errors)
    spec = _complete_spec(parse_dataclass(JobSpec, obj.get("spec"), "spec", errors))
    return DistTrainJob(metadata=metadata, spec=spec), errors


def parse_job(obj: Any) -> DistTrainJob:
    """Parse a whole manifest, schema rules only. Raises SpecError with every problem.

    Prefer `validation.load_job`, which adds the cross-field rules.
    """
    job, errors = parse_job_partial(obj)
    if errors:
        raise SpecError(errors)
    return job
