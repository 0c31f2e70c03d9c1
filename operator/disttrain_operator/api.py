"""The `DistTrainJob` API (`disttrain.dev/v1alpha1`) as one typed model.

This module is the single source of truth: the CRD's OpenAPI schema is generated
from these dataclasses (see `crd.py`), `disttrain validate` and the operator parse
manifests with `parse_job`, and the trainer parses its mounted config with
`parse_spec`. It imports nothing beyond the standard library so that the trainer
image and the CLI can use it without kopf.

Field metadata (`fld(...)`) carries what the schema needs: the JSON name,
minimum/maximum, pattern, description. Enumerations are `Literal` types.
Cross-field rules that a schema cannot express live in `validation.py`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

GROUP = "disttrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DistTrainJob"
PLURAL = "disttrainjobs"
SINGULAR = "disttrainjob"
SHORT_NAMES = ("dtj",)
CATEGORIES = ("disttrain",)

Mode = Literal["data", "pipeline", "tensor", "hybrid", "federated", "paramserver"]
Schedule = Literal["GPipe", "1F1B", "Interleaved1F1B", "PipeDream"]
Partition = Literal["uniform", "profile"]
Precision = Literal["fp32", "bf16", "fp16"]
Compression = Literal["none", "fp16", "powersgd"]
Optim = Literal["sgd", "adam", "adamw"]
ScaleRule = Literal["none", "linear", "sqrt"]
Decay = Literal["none", "cosine", "linear", "step"]
DataName = Literal["digits", "pytext", "synthetic"]
FedStrategy = Literal["fedavg", "fedprox"]
FedCompression = Literal["none", "int8", "topk"]
FedPartitionKind = Literal["iid", "dirichlet"]
CleanPodPolicy = Literal["Running", "All", "None"]

BUILTIN_MODELS = ("mlp", "cnn", "gpt")
# A built-in name, or an import path "package.module:factory".
MODEL_NAME_PATTERN = r"^(mlp|cnn|gpt|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
ACT_CKPT_PATTERN = r"^(none|sqrt|every:[1-9][0-9]*)$"
# Kubernetes resource quantity (the API server's own grammar, simplified).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Pod names are "<job>-worker-<index>" and must stay within 63 characters.
MAX_JOB_NAME = 45


class Quantity(str):
    """A Kubernetes quantity: YAML may give it as a number or a string."""


class Object(dict):  # type: ignore[type-arg]
    """A free-form object passed through to Kubernetes (pod template, volume)."""


def fld(
    default: Any = MISSING,
    *,
    factory: Any = MISSING,
    json: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    pattern: str | None = None,
    desc: str = "",
) -> Any:
    meta = {
        "json": json,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "pattern": pattern,
        "description": desc,
    }
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def json_name(f: dataclasses.Field[Any]) -> str:
    explicit = f.metadata.get("json")
    if explicit:
        return str(explicit)
    head, *rest = f.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True, kw_only=True)
class Resources:
    gpus: int = fld(0, minimum=0, desc="GPUs per pod, requested as nvidia.com/gpu.")
    cpu: Quantity = fld(Quantity("1"), pattern=QUANTITY_PATTERN, desc="CPU request and limit per pod.")
    memory: Quantity = fld(Quantity("2Gi"), pattern=QUANTITY_PATTERN, desc="Memory request and limit per pod.")


@dataclass(frozen=True, kw_only=True)
class Workers:
    replicas: int = fld(2, minimum=1, maximum=1024, desc="Worker pods.")
    procs_per_worker: int = fld(1, minimum=1, maximum=64, desc="Training processes per pod (usually = GPUs per pod).")
    resources: Resources = fld(factory=Resources)
    template: Object = fld(
        factory=Object,
        desc="Pod-spec overrides merged into every worker pod: nodeSelector, tolerations, affinity, "
        "priorityClassName, env, volumes, ...",
    )


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    tensor: int = fld(1, minimum=1, desc="Tensor (intra-layer) parallel degree.")
    pipeline: int = fld(1, minimum=1, desc="Pipeline (inter-layer) parallel degree = stages.")
    schedule: Schedule = fld("1F1B", desc="Pipeline schedule.")
    microbatches: int = fld(8, minimum=1, desc="Micro-batches per step in pipeline modes.")
    partition: Partition = fld("profile", desc="How layers are split into stages.")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str = fld("mlp", pattern=MODEL_NAME_PATTERN, desc="Built-in model (mlp, cnn, gpt) or 'module:factory'.")
    hidden: int = fld(128, minimum=1, desc="Hidden width (MLP units, CNN channels, GPT embedding).")
    layers: int = fld(2, minimum=1, desc="Hidden layers (MLP) or transformer blocks (GPT).")
    heads: int = fld(4, minimum=1, desc="Attention heads (GPT).")
    block_size: int = fld(64, minimum=1, desc="Context length in tokens (GPT).")
    dropout: float = fld(0.0, minimum=0.0, maximum=1.0, desc="Dropout probability.")


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    name: DataName = fld("digits", desc="digits (scikit-learn), pytext (text shipped with CPython), synthetic.")
    batch_size: int = fld(256, minimum=1, desc="Global batch size per optimizer step.")
    seed: int = fld(0, minimum=0, desc="Seed for the split, the sampler and model initialisation.")
    shards: int = fld(4, minimum=1, maximum=4096, desc="Shard files the dataset is packed into.")
    synthetic_samples: int = fld(8192, minimum=1, desc="Samples of the synthetic dataset.")


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    name: Optim = fld("sgd")
    lr: float = fld(0.1, minimum=0.0, exclusive_minimum=True, desc="Learning rate at baseBatchSize.")
    momentum: float = fld(0.9, minimum=0.0, maximum=1.0)
    weight_decay: float = fld(0.0, minimum=0.0)
    scale_lr: ScaleRule = fld("linear", json="scaleLR", desc="Large-batch rule: lr x (batchSize / baseBatchSize).")
    base_batch_size: int = fld(256, minimum=1, desc="Batch size the lr was tuned for.")
    warmup_steps: int = fld(0, minimum=0, desc="Gradual warmup from lr/scale to the scaled lr.")
    decay: Decay = fld("cosine", desc="Schedule after warmup.")
    min_lr_ratio: float = fld(0.0, minimum=0.0, maximum=1.0, json="minLRRatio", desc="Final lr as a fraction of peak.")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    steps: int = fld(500, minimum=1, desc="Optimizer steps.")
    precision: Precision = fld("fp32", desc="fp16 needs GPUs; bf16 and fp32 also run on CPU.")
    activation_checkpointing: str = fld("none", pattern=ACT_CKPT_PATTERN, desc="none, sqrt, or every:K.")
    gradient_compression: Compression = fld("none", desc="DDP communication hook.")
    powersgd_rank: int = fld(2, minimum=1, json="powerSGDRank", desc="Rank of PowerSGD's low-rank factors.")
    grad_accumulation: int = fld(1, minimum=1, desc="Micro-steps per optimizer step; only the last synchronises.")
    bucket_cap_mb: float = fld(25.0, minimum=0.0, exclusive_minimum=True, json="bucketCapMB", desc="DDP bucket size.")
    eval_interval_steps: int = fld(0, minimum=0, desc="Evaluate every N steps (0: only at the end).")
    log_interval_steps: int = fld(10, minimum=1, desc="Log metrics every N steps.")


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    interval_steps: int = fld(50, minimum=1, desc="Save every N steps (and at the end).")
    keep: int = fld(3, minimum=1, desc="Newest checkpoints kept.")
    path: str = fld("/checkpoints", pattern=r"^/.*", desc="Mount path of the checkpoint volume in worker pods.")
    volume: Object = fld(
        factory=Object,
        desc="A Kubernetes volume source for checkpoints (e.g. persistentVolumeClaim: {claimName: x}); "
        "empty means an emptyDir, which does not survive a gang restart onto other pods.",
    )


@dataclass(frozen=True, kw_only=True)
class ElasticSpec:
    min_replicas: int = fld(1, minimum=1)
    max_replicas: int = fld(4, minimum=1)
    schedule_timeout_seconds: int = fld(60, minimum=1, desc="Wait this long for a full-size gang before shrinking.")


@dataclass(frozen=True, kw_only=True)
class FedPartition:
    kind: FedPartitionKind = fld("dirichlet")
    alpha: float = fld(0.5, minimum=0.0, exclusive_minimum=True, desc="Dirichlet concentration (smaller = more skew).")


@dataclass(frozen=True, kw_only=True)
class FederatedSpec:
    clients: int = fld(10, minimum=1)
    clients_per_round: int = fld(5, minimum=1)
    rounds: int = fld(30, minimum=1)
    local_epochs: int = fld(1, minimum=1)
    strategy: FedStrategy = fld("fedavg")
    proximal_mu: float = fld(0.01, minimum=0.0, desc="FedProx proximal term.")
    compression: FedCompression = fld("none")
    topk_ratio: float = fld(0.01, minimum=0.0, maximum=1.0, exclusive_minimum=True, desc="Kept fraction with topk.")
    secure_aggregation: bool = fld(False)
    round_timeout_seconds: int = fld(60, minimum=1)
    max_update_norm: float = fld(1000.0, minimum=0.0, exclusive_minimum=True, desc="Updates above this L2 norm are rejected.")
    port: int = fld(50051, minimum=1, maximum=65535, desc="Aggregator gRPC port.")
    partition: FedPartition = fld(factory=FedPartition)


@dataclass(frozen=True, kw_only=True)
class ParamServerSpec:
    max_staleness: int = fld(4, minimum=0, desc="Bound on how many versions a pushed gradient may lag.")
    port: int = fld(50052, minimum=1, maximum=65535, desc="Parameter-server gRPC port.")


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    backoff_limit: int = fld(3, minimum=0, desc="Gang restarts before the job fails.")
    active_deadline_seconds: int | None = fld(None, minimum=1)
    ttl_seconds_after_finished: int | None = fld(None, minimum=0)
    clean_pod_policy: CleanPodPolicy = fld("Running", desc="Pods deleted when the job finishes.")
    suspend: bool = fld(False, desc="Delete the pods, keep checkpoints; false resumes.")


@dataclass(frozen=True, kw_only=True)
class MetricsSpec:
    port: int = fld(9400, minimum=1024, maximum=65535, desc="Rank r serves /metrics on port + local rank.")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    mode: Mode = fld("data", desc="Parallel mode.")
    image: str | None = fld(None, desc="Trainer image; default from the operator's settings.")
    workers: Workers = fld(factory=Workers)
    parallelism: Parallelism = fld(factory=Parallelism)
    model: ModelSpec = fld(factory=ModelSpec)
    data: DataSpec = fld(factory=DataSpec)
    optimizer: OptimizerSpec = fld(factory=OptimizerSpec)
    training: TrainingSpec = fld(factory=TrainingSpec)
    checkpoint: CheckpointSpec = fld(factory=CheckpointSpec)
    elastic: ElasticSpec | None = fld(None, desc="Shrink a gang that cannot be scheduled at full size.")
    federated: FederatedSpec | None = fld(None, desc="Only in federated mode.")
    param_server: ParamServerSpec | None = fld(None, json="paramServer", desc="Only in paramserver mode.")
    run_policy: RunPolicy = fld(factory=RunPolicy)
    metrics: MetricsSpec = fld(factory=MetricsSpec)

    @property
    def world_size(self) -> int:
        return self.workers.replicas * self.workers.procs_per_worker

    @property
    def data_degree(self) -> int:
        return self.world_size // (self.parallelism.tensor * self.parallelism.pipeline)


@dataclass(frozen=True, kw_only=True)
class Metadata:
    name: str
    namespace: str = "default"


@dataclass(frozen=True, kw_only=True)
class DistTrainJob:
    metadata: Metadata
    spec: JobSpec


# ---------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """Every problem found in one manifest, each with its field path."""

    def __init__(self, errors: list[FieldError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _check_range(value: float, meta: typing.Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None:
        if meta.get("exclusive_minimum") and not value > lo:
            errors.append(FieldError(path, f"{value} must be greater than {lo}"))
        elif value < lo:
            errors.append(FieldError(path, f"{value} must be >= {lo}"))
    if hi is not None and value > hi:
        errors.append(FieldError(path, f"{value} must be <= {hi}"))


def _parse_value(tp: Any, value: Any, meta: typing.Mapping[str, Any], path: str, errors: list[FieldError]) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _parse_value(inner[0], value, meta, path, errors)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            errors.append(FieldError(path, f"{value!r} is not one of {', '.join(map(str, allowed))}"))
            return allowed[0]
        return value
    if dataclasses.is_dataclass(tp):
        return _parse_dataclass(tp, value, path, errors)
    if tp is Object:
        if not isinstance(value, dict):
            errors.append(FieldError(path, f"expected an object, got {_describe(value)}"))
            return Object()
        return Object(value)
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(FieldError(path, f"expected a boolean, got {_describe(value)}"))
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(FieldError(path, f"expected an integer, got {_describe(value)} {value!r}"))
            return 0
        _check_range(value, meta, path, errors)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(FieldError(path, f"expected a number, got {_describe(value)} {value!r}"))
            return 0.0
        if value != value or value in (float("inf"), float("-inf")):
            errors.append(FieldError(path, f"{value} is not a finite number"))
            return 0.0
        _check_range(float(value), meta, path, errors)
        return float(value)
    if tp is Quantity:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            errors.append(FieldError(path, f"expected a quantity such as 2 or 500m or 4Gi, got {_describe(value)}"))
            return Quantity("0")
        text = str(value)
        if not re.match(QUANTITY_PATTERN, text):
            errors.append(FieldError(path, f"{text!r} is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)"))
        return Quantity(text)
    if tp is str:
        if not isinstance(value, str):
            errors.append(FieldError(path, f"expected a string, got {_describe(value)}"))
            return ""
        pattern = meta.get("pattern")
        if pattern and not re.match(pattern, value):
            errors.append(FieldError(path, f"{value!r} does not match {pattern}"))
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug in this module, not in input


def _parse_dataclass(cls: Any, data: Any, path: str, errors: list[FieldError]) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.append(FieldError(path, f"expected an object, got {_describe(data)}"))
        data = {}
    hints = get_type_hints(cls)
    fields = dataclasses.fields(cls)
    by_json = {json_name(f): f for f in fields}
    for key in data:
        if key not in by_json:
            known = ", ".join(sorted(by_json))
            errors.append(FieldError(f"{path}.{key}", f"unknown field (known fields: {known})"))
    kwargs: dict[str, Any] = {}
    for name, f in by_json.items():
        sub = f"{path}.{name}"
        if name in data:
            value = data[name]
            if value is None and get_origin(hints[f.name]) not in (Union, types.UnionType):
                # An explicit null means "use the default", as kubectl apply does.
                continue
            kwargs[f.name] = _parse_value(hints[f.name], value, f.metadata, sub, errors)
        elif f.default is MISSING and f.default_factory is MISSING:
            errors.append(FieldError(sub, "required field is missing"))
            kwargs[f.name] = None
    return cls(**kwargs)


def parse_spec(data: Any, path: str = "spec") -> JobSpec:
    """Parse and range-check a spec (schema-level rules only). Raises SpecError."""
    errors: list[FieldError] = []
    spec = _parse_dataclass(JobSpec, data, path, errors)
    if errors:
        raise SpecError(errors)
    return spec


def parse_job(obj: Any) -> DistTrainJob:
    """Parse a whole manifest, schema rules only; see validation.validate_job for cross-field rules."""
    errors: list[FieldError] = []
    if not isinstance(obj, dict):
        raise SpecError([FieldError("(document)", f"expected an object, got {_describe(obj)}")])
    if obj.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"{obj.get('apiVersion')!r} must be {API_VERSION}"))
    if obj.get("kind") != KIND:
        errors.append(FieldError("kind", f"{obj.get('kind')!r} must be {KIND}"))
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        errors.append(FieldError("metadata.name", "required field is missing"))
        name = "invalid"
    elif not re.match(DNS_LABEL_PATTERN, name) or len(name) > MAX_JOB_NAME:
        errors.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS label (lower-case letters, digits, '-') of at most {MAX_JOB_NAME} characters",
            )
        )
    namespace = meta.get("namespace", "default") if isinstance(meta, dict) else "default"
    spec = _parse_dataclass(JobSpec, obj.get("spec"), "spec", errors)
    if errors:
        raise SpecError(errors)
    return DistTrainJob(metadata=Metadata(name=name, namespace=str(namespace or "default")), spec=spec)


def to_json(obj: Any) -> Any:
    """Dataclass -> plain JSON-able dict with API (camelCase) names; defaults included."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {json_name(f): to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Quantity):
        return str(obj)
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj
