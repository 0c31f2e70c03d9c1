"""The `DistTrainJob` API (`disttrain.dev/v1alpha1`) as one typed model.

This package is the single source of truth: the CRD's OpenAPI schema is generated
from these dataclasses (see `crd.py`), `disttrain validate` and the operator load
manifests with `validation.load_job` (schema + cross-field rules), and the
trainer parses its mounted config with `parse_spec`. It imports nothing beyond
the standard library so that the trainer image and the CLI can use it without kopf.

One module per part of the spec: vocabulary.py (group, kind, enumerations, patterns),
workers.py, training.py (parallelism, model, data, optimizer, training, checkpoint,
elastic), fault_tolerance.py (faultTolerance, training.sync), federated.py, paramserver.py, object_store.py,
tracking.py, run_policy.py, job.py (JobSpec, the whole job and
its parsing) and status.py. `disttrain_api.model` is where every name is imported from.

Field metadata (`fld(...)`, see `dataparse.py`) carries what the schema needs:
the JSON name, minimum/maximum, pattern, description. Enumerations are
`Literal` types. Cross-field rules that a schema cannot express live in
`validation.py`. The status model (`JobStatus`) is written by the operator.
"""

from __future__ import annotations

from ..dataparse import (
    QUANTITY_PATTERN,
    FieldError,
    Object,
    Quantity,
    SpecError,
    Time,
    describe,
    fld,
    json_name,
    parse_dataclass,
    to_json,
)
from .fault_tolerance import FaultToleranceSpec, OuterOptimizerSpec, SyncKind, SyncSpec
from .federated import FederatedSpec, FedPartition, FedPrivacy
from .job import (
    DistTrainJob,
    JobSpec,
    Metadata,
    MetricsSpec,
    parse_job,
    parse_job_partial,
    parse_spec,
)
from .object_store import ObjectStoreSpec
from .paramserver import ParamServerSpec
from .run_policy import RunPolicy
from .status import (
    Condition,
    JobSecrets,
    JobStatus,
    Progress,
    ReplicaGroups,
    WorkerCounts,
    parse_status,
)
from .tracking import MlflowSpec, TrackingSpec
from .training import (
    CheckpointSpec,
    DataSpec,
    ElasticSpec,
    ModelSpec,
    OptimizerSpec,
    Parallelism,
    TrainingSpec,
)
from .vocabulary import (
    ACT_CKPT_PATTERN,
    API_VERSION,
    BUILTIN_MODELS,
    CATEGORIES,
    DNS_LABEL_PATTERN,
    GROUP,
    HF_MODEL_PREFIX,
    JOB_NAME_PATTERN,
    KIND,
    MAX_JOB_NAME,
    MODEL_NAME_PATTERN,
    PLURAL,
    ROBUST_STRATEGIES,
    SHORT_NAMES,
    SINGULAR,
    TOP_LEVEL_FIELDS,
    VERSION,
    CleanPodPolicy,
    CompileMode,
    Compression,
    ConditionStatus,
    DataName,
    DataStrategy,
    Decay,
    FedCompression,
    FedPartitionKind,
    FedStrategy,
    Mode,
    Optim,
    Partition,
    Phase,
    Precision,
    ScaleRule,
    Schedule,
)
from .workers import Resources, Workers

__all__ = [
    "ACT_CKPT_PATTERN",
    "API_VERSION",
    "BUILTIN_MODELS",
    "CATEGORIES",
    "CheckpointSpec",
    "CleanPodPolicy",
    "CompileMode",
    "Compression",
    "Condition",
    "ConditionStatus",
    "DNS_LABEL_PATTERN",
    "DataName",
    "DataSpec",
    "DataStrategy",
    "Decay",
    "DistTrainJob",
    "ElasticSpec",
    "FedCompression",
    "FedPartition",
    "FedPartitionKind",
    "FedPrivacy",
    "FedStrategy",
    "FaultToleranceSpec",
    "FederatedSpec",
    "FieldError",
    "GROUP",
    "JOB_NAME_PATTERN",
    "JobSpec",
    "JobSecrets",
    "JobStatus",
    "Progress",
    "KIND",
    "MAX_JOB_NAME",
    "HF_MODEL_PREFIX",
    "MODEL_NAME_PATTERN",
    "Metadata",
    "MlflowSpec",
    "MetricsSpec",
    "Mode",
    "ModelSpec",
    "Object",
    "Optim",
    "OptimizerSpec",
    "OuterOptimizerSpec",
    "PLURAL",
    "Parallelism",
    "ObjectStoreSpec",
    "ParamServerSpec",
    "Partition",
    "Phase",
    "Precision",
    "QUANTITY_PATTERN",
    "Quantity",
    "ROBUST_STRATEGIES",
    "ReplicaGroups",
    "Resources",
    "RunPolicy",
    "SHORT_NAMES",
    "SINGULAR",
    "ScaleRule",
    "Schedule",
    "SpecError",
    "SyncKind",
    "SyncSpec",
    "TOP_LEVEL_FIELDS",
    "Time",
    "TrackingSpec",
    "TrainingSpec",
    "VERSION",
    "WorkerCounts",
    "Workers",
    "describe",
    "fld",
    "json_name",
    "parse_dataclass",
    "parse_job",
    "parse_job_partial",
    "parse_spec",
    "parse_status",
    "to_json",
]
