"""Operator settings: parsed once at the edge (CLI flags over environment variables).

Every knob has an env var so the in-cluster Deployment can be configured without
changing its command line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disttrain_api.progress import PROGRESS_INTERVAL_S

from .decision import TLS_RENEW_BEFORE_S, TLS_VALID_S

ENV_PREFIX = "DISTTRAIN_OPERATOR_"
DEFAULT_IMAGE = "disttrain-trainer:dev"
# Kubernetes' default-not-ready/unreachable-toleration-seconds (the pod-eviction default).
NODE_LOST_AFTER_S = 300.0
# Dynamic provisioning takes seconds on most clusters (a network file system's share can take
# a minute or two); a claim Pending longer is worth a warning.
CLAIM_PENDING_AFTER_S = 120.0


@dataclass(frozen=True, kw_only=True)
class GpuPods:
    """What a worker pod asking for GPUs gets besides its nvidia.com/gpu limit: where GPU nodes
    are and how to run on them (the Helm chart's trainer.gpu values). The job's own
    workers.template wins over these."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    runtime_class_name: str = ""  # e.g. "nvidia" where the NVIDIA runtime is not the default
    # The trainer image for jobs that ask for GPUs and name no image of their own (a CUDA build:
    # `make image-cuda`); empty: the default image, CPU-only unless the operator's default is a
    # CUDA build itself.
    image: str = ""


@dataclass(frozen=True, kw_only=True)
class OperatorSettings:
    # Empty tuple + all_namespaces=False means "the namespace the operator runs in" (or default).
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    default_image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    metrics_port: int = 8080  # operator's own /metrics; 0 = off
    liveness: str = ""  # e.g. http://0.0.0.0:8081/healthz; empty = off
    # How often a running job's rank 0 metrics are scraped, the most often a change of pod
    # counts or progress alone is written to its status, and how soon a job waiting on the
    # clock (a deadline, a force-delete or node-lost timeout) is reconciled again. Pod and
    # job changes themselves are reconciled as their watch events arrive.
    poll_interval_s: float = 3.0
    # The most often a running job's progress alone (status.progress, step, pod counts) is
    # written: the status write rate per job stays bounded whatever the number of workers.
    progress_interval_s: float = PROGRESS_INTERVAL_S
    # A pod stuck Terminating this long (a dead node cannot confirm) is force-deleted.
    force_delete_after_s: float = 30.0
    # A Running pod whose Ready condition turned False (node lost) this long counts as failed and
    # its gang is replaced (its pods force-deleted). Kubernetes' own default: pods tolerate a
    # not-ready/unreachable node for 300 s before they are evicted. Shorter detects a lost node
    # sooner, but a pod on a partitioned node keeps running meanwhile: checkpoint fencing
    # (trainer checkpoints/fence.py) is what keeps such a process from writing.
    node_lost_after_s: float = NODE_LOST_AFTER_S
    scrape_timeout_s: float = 1.5
    gpu: GpuPods = field(default_factory=GpuPods)
    # The StorageClass of the checkpoint claim the operator creates for a job without
    # spec.checkpoint.volume; empty: the cluster's default StorageClass.
    checkpoint_storage_class: str = ""
    # A job's claim still Pending this long (no volume provisioned for it) gets the condition
    # CheckpointClaimPending and a Warning Event saying why that may be.
    claim_pending_after_s: float = CLAIM_PENDING_AFTER_S
    # Every job may train on CPU when its GPUs are missing (passed to pods as
    # DISTTRAIN_ALLOW_CPU_FALLBACK); on for clusters that advertise GPUs they lack.
    allow_cpu_fallback: bool = False
    # Run only while holding a coordination Lease (leader.py), so that several replicas can
    # run with one active; off for the single-replica default, which needs no Lease.
    leader_elect: bool = False
    lease_namespace: str = ""  # empty: the operator's own namespace
    # The TLS certificates the operator mints for federated and parameter-server jobs: valid this
    # long, and replaced (a new Secret, the gang and its servers recreated on it) once only
    # tls_renew_before_s of their validity is left (job_secrets.py).
    tls_valid_s: float = TLS_VALID_S
    tls_renew_before_s: float = TLS_RENEW_BEFORE_S
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.tls_renew_before_s < self.tls_valid_s:
            raise ValueError(
                f"{ENV_PREFIX}TLS_RENEW_BEFORE ({self.tls_renew_before_s:g} s) must be positive and shorter than "
                f"{ENV_PREFIX}TLS_VALIDITY ({self.tls_valid_s:g} s): a new certificate would be due at once"
            )

    def trainer_image(self, job_image: str, gpus: int) -> str:
        """The image a job's pods run: its own `spec.image`, else the GPU image for a job that
        asks for GPUs (when one is set), else the default."""
        if job_image:
            return job_image
        if gpus > 0 and self.gpu.image:
            return self.gpu.image
        return self.default_image

    def watch_namespaces(self) -> list[str]:
        if self.all_namespaces:
            return []
        if self.namespaces:
            return list(self.namespaces)
        return [own_namespace()]


def own_namespace() -> str:
    """The namespace of the operator's pod (service-account mount), else `default`."""
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return os.environ.get("POD_NAMESPACE", "default")


def _env_bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def from_env(environ: Mapping[str, str] | None = None, **overrides: object) -> OperatorSettings:
    """Settings from DISTTRAIN_OPERATOR_* env vars; keyword overrides (from CLI flags) win when not None."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        return env.get(ENV_PREFIX + name)

    def number(name: str, default: float, kind: type = int) -> object:
        raw = get(name)
        if raw is None or raw == "":
            return default
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{ENV_PREFIX}{name}={raw!r} is not a number; set it to e.g. {default}") from None

    def json_value(name: str, kind: type, example: str) -> Any:
        raw = get(name)
        if raw is None or raw.strip() == "":
            return kind()
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{ENV_PREFIX}{name} is not JSON ({e}); set it to e.g. {example}") from None
        if not isinstance(value, kind):
            raise ValueError(f"{ENV_PREFIX}{name} must be a JSON {kind.__name__}, e.g. {example}")
        return value

    ns = get("NAMESPACE")
    values: dict[str, object] = {
        "namespaces": tuple(n.strip() for n in ns.split(",") if n.strip()) if ns else (),
        "all_namespaces": _env_bool(get("ALL_NAMESPACES"), False),
        "default_image": get("DEFAULT_IMAGE") or DEFAULT_IMAGE,
        "image_pull_policy": get("IMAGE_PULL_POLICY") or "IfNotPresent",
        "metrics_port": number("METRICS_PORT", 8080),
        "liveness": get("LIVENESS") or "",
        "poll_interval_s": number("POLL_INTERVAL", 3.0, float),
        "progress_interval_s": number("PROGRESS_INTERVAL", PROGRESS_INTERVAL_S, float),
        "force_delete_after_s": number("FORCE_DELETE_AFTER", 30.0, float),
        "node_lost_after_s": number("NODE_LOST_AFTER", NODE_LOST_AFTER_S, float),
        "gpu": GpuPods(
            node_selector=json_value("GPU_NODE_SELECTOR", dict, '{"nvidia.com/gpu.present": "true"}'),
            tolerations=tuple(json_value("GPU_TOLERATIONS", list, '[{"key": "gpu", "operator": "Exists"}]')),
            runtime_class_name=get("GPU_RUNTIME_CLASS") or "",
            image=get("GPU_IMAGE") or "",
        ),
        "checkpoint_storage_class": (get("CHECKPOINT_STORAGE_CLASS") or "").strip(),
        "claim_pending_after_s": number("CLAIM_PENDING_AFTER", CLAIM_PENDING_AFTER_S, float),
        "allow_cpu_fallback": _env_bool(get("ALLOW_CPU_FALLBACK"), False),
        "leader_elect": _env_bool(get("LEADER_ELECT"), False),
        "lease_namespace": get("LEASE_NAMESPACE") or "",
        "tls_valid_s": number("TLS_VALIDITY", TLS_VALID_S, float),
        "tls_renew_before_s": number("TLS_RENEW_BEFORE", TLS_RENEW_BEFORE_S, float),
    }
    for key, value in overrides.items():
        if value is not None:
            values[key] = value
    if values["all_namespaces"] and values["namespaces"]:
        raise ValueError("choose either --namespace/DISTTRAIN_OPERATOR_NAMESPACE or --all-namespaces, not both")
    return OperatorSettings(**values)  # type: ignore[arg-type]
