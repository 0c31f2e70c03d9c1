"""The `DistTrainJob` API (`disttrain.dev/v1alpha1`) as one typed model.

This module is the single source of truth: the CRD's OpenAPI schema is generated
from these dataclasses (see `crd.py`), `disttrain validate` and the operator load
manifests with `validation.load_job` (schema + cross-field rules), and the
trainer parses its mounted config with `parse_spec`. It imports nothing beyond
the standard library so that the trainer image and the CLI can use it without kopf.

Field metadata (`fld(...)`, see `dataparse.py`) carries what the schema needs:
the JSON name, minimum/maximum, pattern, description. Enumerations are
`Literal` types. Cross-field rules that a schema cannot express live in
`validation.py`. The status model (`JobStatus`) is written by the operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from disttrain_api.dataparse import (  # re-exported: others import these from api
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

__all__ = [
    "API_VERSION", "DistTrainJob", "FieldError", "JobSpec", "JobStatus", "Object", "Quantity",
    "SpecError", "Time", "fld", "json_name", "parse_job", "parse_job_partial", "parse_spec",
    "parse_status", "to_json",
]

GROUP = "disttrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DistTrainJob"
PLURAL = "disttrainjobs"
SINGULAR = "disttrainjob"
SHORT_NAMES = ("dtj",)
CATEGORIES = ("disttrain",)

Mode = Literal["data", "pipeline", "tensor", "hybrid", "federated", "paramserver"]
Schedule = Literal[
    "Naive", "GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "PipeDream"
]
Partition = Literal["uniform", "params", "profile"]
DataStrategy = Literal["ddp", "fsdp"]
Precision = Literal["fp32", "bf16", "fp16"]
Compression = Literal["none", "fp16", "powersgd"]
Optim = Literal["sgd", "adam", "adamw"]
ScaleRule = Literal["none", "linear", "sqrt"]
Decay = Literal["none", "cosine", "linear", "step"]
DataName = Literal["digits", "pytext", "synthetic"]
FedStrategy = Literal["fedavg", "fedprox", "fedadam", "fedmedian", "trimmedMean", "krum", "multiKrum"]
# Rules over the individual updates (a secure aggregate hides them).
ROBUST_STRATEGIES = ("fedmedian", "trimmedMean", "krum", "multiKrum")
FedCompression = Literal["none", "int8", "topk"]
FedPartitionKind = Literal["iid", "dirichlet"]
CleanPodPolicy = Literal["Running", "All", "None"]
Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
ConditionStatus = Literal["True", "False", "Unknown"]

BUILTIN_MODELS = ("mlp", "cnn", "gpt")
# A built-in name, or an import path "package.module:factory".
MODEL_NAME_PATTERN = r"^(mlp|cnn|gpt|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
ACT_CKPT_PATTERN = r"^(none|sqrt|every:[1-9][0-9]*)$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A job's name is its headless Service's name, so it must be a DNS-1035 label (a Service
# name starts with a letter), short enough that every derived name stays a 63-character
# label: pods and hostnames "<job>-worker-<index>" / "<job>-client-<index>" (index < 1024),
# Services "<job>-aggregator", "<job>-server-<shard>".
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_JOB_NAME = 45
TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


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
    resources: Resources = fld(factory=Resources, desc="Per-pod resources (requests = limits).")
    template: Object = fld(
        factory=Object,
        desc="Additions merged into every worker pod, from an allow-list (the pods stay within the restricted Pod "
        "Security Standard): env, volumes (persistentVolumeClaim, emptyDir, configMap, secret, projected, "
        "downwardAPI, csi, ephemeral) and volumeMounts, nodeSelector, affinity, tolerations, "
        "topologySpreadConstraints, priorityClassName, schedulerName, runtimeClassName, imagePullSecrets, labels, "
        "annotations, and containers (the trainer's or a sidecar's image, imagePullPolicy, command, args, "
        "workingDir, env, envFrom, volumeMounts). Anything else is a validation error.",
    )
    allow_cpu_fallback: bool = fld(
        False,
        json="allowCPUFallback",
        desc="With resources.gpus > 0, train on CPU when a pod sees no CUDA device instead of failing "
        "(exit 2, TrainerConfigError). The operator setting DISTTRAIN_OPERATOR_ALLOW_CPU_FALLBACK allows it "
        "for every job.",
    )


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    tensor: int = fld(1, minimum=1, desc="Tensor (intra-layer) parallel degree.")
    pipeline: int = fld(1, minimum=1, desc="Pipeline (inter-layer) parallel degree = stages.")
    schedule: Schedule = fld(
        "1F1B",
        desc="Pipeline schedule: Naive (one batch through the stages in turn), GPipe, 1F1B, Interleaved1F1B, "
        "InterleavedZeroBubble, ZBVZeroBubble (torch.distributed.pipelining) or PipeDream (asynchronous 1F1B "
        "with weight stashing).",
    )
    microbatches: int = fld(8, minimum=1, desc="Micro-batches per step in pipeline modes (Naive uses 1).")
    virtual_stages: int = fld(
        1, minimum=1, maximum=16,
        desc="Stages per rank: 1, or >= 2 for the interleaved schedules (exactly 2 for ZBVZeroBubble).",
    )
    partition: Partition = fld(
        "profile",
        desc="How blocks are split into stages: uniform (equal block counts), params (equal parameter counts) "
        "or profile (measured time and activation size, balanced by dynamic programming).",
    )
    data_strategy: DataStrategy = fld(
        "ddp",
        desc="The data dimension: ddp (every rank holds whole replicas and all-reduces gradients) or fsdp "
        "(FSDP2 fully_shard: parameters, gradients and optimizer state sharded ZeRO-3 style; modes data and "
        "hybrid with pipeline 1).",
    )
    sequence_parallel: bool = fld(
        False,
        desc="With tensor > 1: shard layer norms, dropout and the residual stream along the sequence "
        "(Korthikanti et al. 2022), turning each all-reduce into a reduce-scatter + all-gather.",
    )


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
    batch_size: int = fld(
        256,
        minimum=1,
        desc="Global batch size per optimizer step, split evenly over data-parallel ranks, micro-batches "
        "(when parallelism.pipeline > 1) and gradAccumulation micro-steps. In federated mode: each client's "
        "local batch size.",
    )
    seed: int = fld(0, minimum=0, desc="Seed for the split, the sampler and model initialisation.")
    shards: int = fld(4, minimum=1, maximum=4096, desc="Shard files the dataset is packed into.")
    synthetic_samples: int = fld(8192, minimum=1, desc="Samples of the synthetic dataset.")


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    name: Optim = fld("sgd", desc="sgd (with momentum), adam or adamw.")
    lr: float = fld(0.1, minimum=0.0, exclusive_minimum=True, desc="Learning rate at baseBatchSize.")
    momentum: float = fld(0.9, minimum=0.0, maximum=1.0, desc="SGD momentum (ignored by adam/adamw).")
    weight_decay: float = fld(0.0, minimum=0.0, desc="L2 penalty (decoupled for adamw).")
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
    path: str = fld(
        "/checkpoints", pattern=r"^/.*",
        desc="Mount path of the checkpoint volume in worker pods; not one the operator mounts (/etc/disttrain, "
        "/run/disttrain, /tmp, /dev/termination-log) nor a folder holding one.",
    )
    volume: Object = fld(
        factory=Object,
        desc="A Kubernetes volume source for checkpoints (e.g. persistentVolumeClaim: {claimName: x}; no hostPath: "
        "worker pods are restricted); empty means an emptyDir, which does not survive a gang restart onto other pods.",
    )


@dataclass(frozen=True, kw_only=True)
class ElasticSpec:
    min_replicas: int = fld(1, minimum=1, desc="Smallest gang (pods) the job may shrink to.")
    max_replicas: int = fld(4, minimum=1, desc="Largest gang (pods) the job may grow back to.")
    schedule_timeout_seconds: int = fld(60, minimum=1, desc="Wait this long for a full-size gang before shrinking.")


@dataclass(frozen=True, kw_only=True)
class FedPartition:
    kind: FedPartitionKind = fld("dirichlet", desc="iid or dirichlet (label-skewed, non-IID) split over clients.")
    alpha: float = fld(0.5, minimum=0.0, exclusive_minimum=True, desc="Dirichlet concentration (smaller = more skew).")


@dataclass(frozen=True, kw_only=True)
class FedPrivacy:
    """Central differential privacy at the aggregator (DP-FedAvg, McMahan et al. 2018)."""

    clip_norm: float = fld(
        minimum=0.0, exclusive_minimum=True,
        desc="Each client's update is scaled down to at most this L2 norm before it is summed.",
    )
    noise_multiplier: float = fld(
        minimum=0.0, exclusive_minimum=True,
        desc="Gaussian noise on the sum of clipped updates has standard deviation noiseMultiplier x "
        "clipNorm; the sum is then divided by clientsPerRound.",
    )
    delta: float = fld(
        1e-5, minimum=0.0, maximum=1.0, exclusive_minimum=True,
        desc="The delta of the (epsilon, delta) budget reported each round (must be < 1 / clients).",
    )


@dataclass(frozen=True, kw_only=True)
class FederatedSpec:
    clients: int = fld(10, minimum=1, desc="Simulated clients, spread over the worker pods.")
    clients_per_round: int = fld(5, minimum=1, desc="Clients sampled per round (<= clients).")
    min_answered_clients: int = fld(
        2, minimum=1,
        desc="A round aggregates only when at least this many sampled clients answered in time; "
        "otherwise it is retried with a new sample (<= clientsPerRound).",
    )
    rounds: int = fld(30, minimum=1, desc="Federated rounds.")
    local_epochs: int = fld(1, minimum=1, desc="Local epochs per client per round.")
    strategy: FedStrategy = fld(
        "fedavg", desc="fedavg (sample-weighted mean), fedprox (proximal term on the clients), "
        "fedadam (Adam on the server over the mean update), or a Byzantine-robust rule over the "
        "individual updates (not with secureAggregation): fedmedian (coordinate-wise median), "
        "trimmedMean (coordinate-wise, trimFraction cut at each end), krum (the update closest to "
        "its n - byzantineClients - 2 nearest others) or multiKrum (mean of the multiKrumSelected best by "
        "that score).",
    )
    trim_fraction: float = fld(
        0.1, minimum=0.0, maximum=0.5,
        desc="trimmedMean: the fraction of updates cut at each end of every coordinate (< 0.5).",
    )
    byzantine_clients: int = fld(
        1, minimum=0,
        desc="krum / multiKrum: how many hostile clients a round must tolerate (f); needs "
        "minAnsweredClients >= 2f + 3.",
    )
    multi_krum_selected: int | None = fld(
        None, minimum=1,
        desc="multiKrum: how many of the best-scored updates are averaged (m); unset: n - f of the n answered.",
    )
    privacy: FedPrivacy | None = fld(
        None, desc="Central differential privacy: clip each update, add Gaussian noise to the sum; "
        "the spent budget (epsilon at delta) is in every round record and the summary.",
    )
    proximal_mu: float = fld(0.01, minimum=0.0, desc="FedProx proximal term.")
    server_learning_rate: float = fld(
        1.0, minimum=0.0, exclusive_minimum=True,
        desc="Server step on the mean update: fedavg/fedprox move by lr x mean (1.0 = plain "
        "averaging); fedadam uses it as Adam's step size (0.01-0.1 is typical).",
    )
    compression: FedCompression = fld("none", desc="Update compression: none, int8 or topk.")
    topk_ratio: float = fld(0.01, minimum=0.0, maximum=1.0, exclusive_minimum=True, desc="Kept fraction with topk.")
    secure_aggregation: bool = fld(False, desc="Pairwise-masked updates: the aggregator sees only the sum.")
    round_timeout_seconds: int = fld(60, minimum=1, desc="Close a round after this long with the updates received.")
    max_update_norm: float = fld(1000.0, minimum=0.0, exclusive_minimum=True, desc="Updates above this L2 norm are rejected.")
    port: int = fld(50051, minimum=1, maximum=65535, desc="Aggregator gRPC port.")
    partition: FedPartition = fld(factory=FedPartition, desc="How the data is split over clients.")
    tls: bool = fld(True, desc="TLS on the aggregator channel in the cluster; clients verify the server against the CA.")
    tls_secret_name: str | None = fld(
        None, pattern=DNS_LABEL_PATTERN,
        desc="Secret (ca.crt, tls.crt, tls.key) for the aggregator; unset: the operator creates a "
        "self-signed CA and server certificate.",
    )
    token_secret_name: str | None = fld(
        None, pattern=DNS_LABEL_PATTERN,
        desc="Not supported: one shared token key would let every client pod speak for every client. "
        "The operator mints one credential per client and mounts each pod only its own; leave unset.",
    )


@dataclass(frozen=True, kw_only=True)
class ParamServerSpec:
    max_staleness: int = fld(
        4, minimum=0,
        desc="A pushed gradient computed on parameters more than this many updates behind its shard's "
        "is rejected (the worker pulls and goes on); within the bound the step is lr / max(1, staleness).",
    )
    shards: int = fld(
        1, minimum=1, maximum=64,
        desc="Server replicas; parameters are split over them by tensor (largest first onto the least "
        "loaded), so no single server carries all the traffic.",
    )
    port: int = fld(50052, minimum=1, maximum=65535, desc="Parameter-server gRPC port (every shard).")
    tls: bool = fld(True, desc="TLS on the parameter-server channels in the cluster; workers verify the servers against the CA.")
    tls_secret_name: str | None = fld(
        None, pattern=DNS_LABEL_PATTERN,
        desc="Secret (ca.crt, tls.crt, tls.key) for the servers, valid for every shard's Service name; unset: "
        "the operator creates a self-signed CA and server certificate.",
    )


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    backoff_limit: int = fld(3, minimum=0, desc="Gang restarts before the job fails.")
    active_deadline_seconds: int | None = fld(None, minimum=1, desc="Fail the job after this long running.")
    ttl_seconds_after_finished: int | None = fld(None, minimum=0, desc="Delete the finished job after this long.")
    clean_pod_policy: CleanPodPolicy = fld("Running", desc="Pods deleted when the job finishes.")
    suspend: bool = fld(False, desc="Delete the pods, keep checkpoints; false resumes.")
    termination_grace_period_seconds: int = fld(
        30, minimum=1,
        desc="The pods' terminationGracePeriodSeconds: on SIGTERM (suspend, drain, eviction, preemption) the "
        "trainer finishes its step, checkpoints it and exits within this; the kubelet kills it after "
        "(the previous checkpoint is then used).",
    )
    child_rejected_timeout_seconds: int = fld(
        300, minimum=0,
        desc="How long the operator retries (with backoff) a pod, Service, ConfigMap, Secret or Deployment that "
        "the API server rejects (e.g. 422 Invalid, 403 Forbidden by a quota or an admission policy) before the "
        "job fails with reason ChildRejected.",
    )


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
    elastic: ElasticSpec | None = fld(None, desc="Shrink a gang that cannot be scheduled at full size.")
    federated: FederatedSpec | None = fld(None, desc="Only in federated mode.")
    param_server: ParamServerSpec | None = fld(None, json="paramServer", desc="Only in paramserver mode.")
    run_policy: RunPolicy = fld(factory=RunPolicy, desc="Restarts, deadlines, cleanup, suspension.")
    metrics: MetricsSpec = fld(factory=MetricsSpec, desc="Prometheus endpoint of each rank.")

    @property
    def world_size(self) -> int:
        return self.workers.replicas * self.workers.procs_per_worker

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



# ------------------------------------------------------------------------ status
# Written by the operator (never by users); the CRD serves it through the status
# subresource. Every field is optional there: the operator fills them over time.
# Free-text fields are nullable: a kube-apiserver 1.20 built with Go >= 1.19 (the
# local cluster's) rejects "" in a non-nullable string field as "must be of type
# string: null" (go-openapi compares against reflect.Zero, which Go now shares).


@dataclass(frozen=True, kw_only=True)
class Condition:
    type: str = fld(desc="Condition type, e.g. Created, Running, Restarting, Succeeded, Failed, InvalidSpec.")
    status: ConditionStatus = fld(desc="True, False or Unknown.")
    reason: str | None = fld(None, desc="One CamelCase word saying why.")
    message: str | None = fld(None, desc="Human-readable details.")
    last_transition_time: Time | None = fld(None, desc="When status last changed.")


@dataclass(frozen=True, kw_only=True)
class WorkerCounts:
    active: int = fld(0, minimum=0, desc="Worker pods pending or running.")
    pending: int = fld(0, minimum=0, desc="Worker pods not yet running.")
    succeeded: int = fld(0, minimum=0, desc="Worker pods that exited 0.")
    failed: int = fld(0, minimum=0, desc="Worker pods that failed.")


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    phase: Phase = fld("Pending", desc="Pending, Running, Restarting, Succeeded, Failed or Suspended.")
    conditions: tuple[Condition, ...] = fld((), desc="Kubernetes-style conditions, one per type.")
    workers: WorkerCounts = fld(factory=WorkerCounts, desc="Worker pods by state.")
    replicas: int = fld(0, minimum=0, desc="Current gang size in pods (smaller than spec with elastic shrinking).")
    restarts: int = fld(0, minimum=0, desc="Gang restarts after failures so far.")
    disruptions: int = fld(
        0, minimum=0,
        desc="Pods ended by a disruption (eviction, drain, preemption, deletion by someone other than the "
        "operator, a trainer stopped on request): the gang restarts (federated, paramserver: the pod is "
        "replaced) without counting against runPolicy.backoffLimit.",
    )
    counted_pods: Object = fld(
        factory=Object,
        desc="Live pods whose end is counted already in restarts or disruptions, UID: name (federated and "
        "paramserver replace pods one by one); the operator's bookkeeping.",
    )
    attempt: int = fld(
        0,
        minimum=0,
        desc="Gang generation: bumps on every gang re-creation (failure restart, elastic resize, resume); "
        "pods carry it as label disttrain.dev/restart-attempt and env DISTTRAIN_RESTART_ATTEMPT.",
    )
    last_spec_replicas: int = fld(
        0,
        minimum=0,
        desc="spec.workers.replicas the operator last applied; a change of it resizes the gang within spec.elastic.",
    )
    step: int = fld(0, minimum=0, desc="Latest training step reported by rank 0.")
    comm_fraction: float | None = fld(
        None,
        minimum=0.0,
        json="commFraction",
        desc="Rank 0's communication seconds / step seconds since its start (the trainer's summary when finished).",
    )
    last_checkpoint_step: int = fld(0, minimum=0, desc="Step of the newest complete checkpoint.")
    start_time: Time | None = fld(None, desc="When the first gang was created.")
    completion_time: Time | None = fld(None, desc="When the job succeeded or failed.")
    observed_generation: int = fld(0, minimum=0, desc="metadata.generation this status reflects.")
    message: str | None = fld(None, desc="Human-readable summary of the current phase.")
    result: Object = fld(
        factory=Object, desc="The trainer's final summary (e.g. testAccuracy, finalLoss, resumedFromStep, wallS)."
    )
    kopf: Object = fld(factory=Object, desc="Handler progress kept by the kopf framework; not an API.")


# ---------------------------------------------------------------------- parsing


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


def parse_status(data: Any) -> JobStatus:
    """Parse `.status` as the operator wrote it. Lenient: unknown keys are ignored,
    because kopf may keep its own keys there (e.g. handler results)."""
    known = {json_name(f) for f in JobStatus.__dataclass_fields__.values()}
    data = {k: v for k, v in (data or {}).items() if k in known} if isinstance(data, dict) else {}
    errors: list[FieldError] = []
    status = parse_dataclass(JobStatus, data, "status", errors)
    if errors:
        raise SpecError(errors)
    return status
