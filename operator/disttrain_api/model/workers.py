"""spec.workers: the gang's pods, their resources and the pod-template additions."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import QUANTITY_PATTERN, Object, Quantity, fld


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
