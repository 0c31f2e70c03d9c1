"""Pieces every topology shares: names, labels, the config ConfigMap, the headless
Service, and the hardened pod spec with the env contract.

Everything here is pure: it takes the typed spec and a `BuildContext` and returns
plain dicts (Kubernetes JSON), so it is unit-tested without a cluster.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disttrain_api import checkpoint_access, checkpoint_storage, pod_rules
from disttrain_api import constants as c
from disttrain_api.model import API_VERSION, KIND, JobSpec, to_json

from ..settings import GpuPods
from .object_store_env import object_store_env

CONTAINER = "trainer"
RUN_DIR = c.RUN_MOUNT_DIR
# The root filesystem is read-only: HOME and the caches of libraries the trainer may load
# point into the writable tmp (an env var the user set wins).
WRITABLE_ENV = {
    "HOME": c.TMP_MOUNT_DIR,
    "XDG_CACHE_HOME": f"{c.TMP_MOUNT_DIR}/.cache",
    "MPLCONFIGDIR": f"{c.TMP_MOUNT_DIR}/matplotlib",
    "TORCHINDUCTOR_CACHE_DIR": f"{c.TMP_MOUNT_DIR}/torchinductor",
    "TRITON_CACHE_DIR": f"{c.TMP_MOUNT_DIR}/triton",
}
# Every container of a worker pod: the restricted Pod Security Standard, and a read-only root.
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
DIST_PORT_NAME = "dist"
METRICS_PORT_NAME = "metrics"
RUN_AS = 10001


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    """What a builder needs beyond the spec; decided by the reconciler."""

    name: str
    namespace: str
    uid: str = ""
    image: str
    image_pull_policy: str = "IfNotPresent"
    attempt: int = 0
    replicas: int  # current gang size (spec.workers.replicas unless elastic shrank it)
    gpu: GpuPods = field(default_factory=GpuPods)  # placement of pods that ask for GPUs
    allow_cpu_fallback: bool = False  # the operator's setting, passed to every pod
    # The Secrets the operator created for the job, by purpose (credentials.IDENTITY, TLS): the
    # names recorded in its status.secrets, the only ones its pods may mount.
    secret_names: Mapping[str, str] = field(default_factory=dict)
    tls_valid_s: float = 365 * 86400.0  # validity of a TLS certificate minted now (settings)
    checkpoint_storage_class: str = ""  # the operator's setting: the class of the job's checkpoint claim


@dataclass(frozen=True, kw_only=True)
class Children:
    """Every object a job owns, in creation order."""

    config_maps: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    # Created once and never replaced (e.g. federated TLS keys: a new CA would cut off clients).
    secrets: list[dict[str, Any]] = field(default_factory=list)
    # Who may connect to the job's pods (networkpolicy.py); created once, like the Secrets.
    network_policies: list[dict[str, Any]] = field(default_factory=list)
    # The job's checkpoint claim (checkpoint_claim.py): created once, before any pod mounts it.
    claims: list[dict[str, Any]] = field(default_factory=list)

    def all(self) -> list[dict[str, Any]]:
        return [*self.secrets, *self.network_policies, *self.claims, *self.config_maps, *self.services,
                *self.deployments, *self.pods]


# ----------------------------------------------------------------------------- names


def service_name(job: str) -> str:
    return job


def config_map_name(job: str) -> str:
    return f"{job}-config"


def pod_name(job: str, role: str, index: int) -> str:
    return f"{job}-{role}-{index}"


def minted_name(ctx: BuildContext, purpose: str) -> str:
    """`<job>-<purpose>-<first 8 hex of the job UID>`: for NetworkPolicies, which the operator
    creates once and never reads back; one left by an earlier job of the same name has another
    name. The UID is public, so anyone who may create NetworkPolicies in the namespace can take
    the name first; that gives them nothing they lack (policies only add up: they could as well
    add one that opens the job's pods). Secrets get unpredictable names instead
    (credentials.fresh_secret_name)."""
    uid = ctx.uid.replace("-", "")[:8]
    return f"{ctx.name}-{purpose}-{uid}" if uid else f"{ctx.name}-{purpose}"


def fqdn(host: str, subdomain: str, namespace: str) -> str:
    return f"{host}.{subdomain}.{namespace}.svc.cluster.local"


def service_fqdn(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc.cluster.local"


def job_labels(job: str) -> dict[str, str]:
    return {c.LABEL_JOB: job}


def pod_labels(job: str, role: str, index: int | None, attempt: int) -> dict[str, str]:
    labels = {c.LABEL_JOB: job, c.LABEL_ROLE: role, c.LABEL_RESTART_ATTEMPT: str(attempt)}
    if index is not None:
        labels[c.LABEL_REPLICA_INDEX] = str(index)
    return labels


def owner_reference(ctx: BuildContext) -> dict[str, Any]:
    # controller=True so `kubectl get` shows the owner and garbage collection deletes children.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": ctx.name,
        "uid": ctx.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(ctx: BuildContext, name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ctx.namespace, "labels": dict(labels)}
    if ctx.uid:
        meta["ownerReferences"] = [owner_reference(ctx)]
    return meta


def effective_spec(spec: JobSpec, ctx: BuildContext) -> JobSpec:
    """The spec the trainer sees: replicas is the current gang size (elastic)."""
    if spec.workers.replicas == ctx.replicas:
        return spec
    return dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, replicas=ctx.replicas))


# ------------------------------------------------------------------ shared objects


def build_config_map(spec: JobSpec, ctx: BuildContext) -> dict[str, Any]:
    body = json.dumps(to_json(effective_spec(spec, ctx)), indent=2, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ctx, config_map_name(ctx.name), job_labels(ctx.name)),
        "data": {c.CONFIG_FILENAME: body},
    }


def build_headless_service(ctx: BuildContext, role: str, ports: list[tuple[str, int]]) -> dict[str, Any]:
    # publishNotReadyAddresses: peers must resolve each other while they are still
    # starting (rendezvous happens before any readiness could be reported).
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, service_name(ctx.name), job_labels(ctx.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: role},
            "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports],
        },
    }


def build_server_deployment(spec: JobSpec, ctx: BuildContext, name: str, pod: dict[str, Any],
                            labels: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """A Deployment of one replica that runs `pod` (a server of the job: the federated aggregator,
    a parameter-server shard, the lighthouse), its pods selected by `labels`."""
    template_meta = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    template_meta["labels"] = {**template_meta["labels"], c.LABEL_MODE: spec.mode}
    pod_spec = copy.deepcopy(pod["spec"])
    pod_spec["restartPolicy"] = "Always"  # a Deployment's pods always restart
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ctx, name, {**labels, c.LABEL_MODE: spec.mode}),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            # Recreate: two copies of one server would each serve part of the gang (two models
            # of an aggregator or a shard, two quorums of a lighthouse).
            "strategy": {"type": "Recreate"},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def build_cluster_service(ctx: BuildContext, name: str, role: str, port_name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, name, {**job_labels(ctx.name), c.LABEL_ROLE: role}),
        "spec": {
            "selector": {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: role},
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


# ----------------------------------------------------------------------------- pods


def resources(spec: JobSpec) -> dict[str, Any]:
    r = spec.workers.resources
    # requests == limits: Guaranteed QoS, and the scheduler's placement matches what runs.
    limits: dict[str, Any] = {"cpu": str(r.cpu), "memory": str(r.memory)}
    if r.gpus > 0:
        limits[c.GPU_RESOURCE] = str(r.gpus)
    return {"requests": {"cpu": str(r.cpu), "memory": str(r.memory)}, "limits": limits}


def env_list(pairs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def contract_env(
    spec: JobSpec,
    ctx: BuildContext,
    *,
    node_rank: int,
    world_size: int,
    master_addr: str,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The env contract (constants.py) for one pod; RANK only when the pod is one rank."""
    nproc = spec.workers.procs_per_worker
    env = {
        c.ENV_MASTER_ADDR: master_addr,
        c.ENV_MASTER_PORT: str(c.DEFAULT_MASTER_PORT),
        c.ENV_WORLD_SIZE: str(world_size),
        c.ENV_NODE_RANK: str(node_rank),
        c.ENV_NPROC_PER_NODE: str(nproc),
        c.ENV_JOB: ctx.name,
        c.ENV_NAMESPACE: ctx.namespace,
        c.ENV_CONFIG: f"{c.CONFIG_MOUNT_DIR}/{c.CONFIG_FILENAME}",
        c.ENV_RESTART_ATTEMPT: str(ctx.attempt),
        c.ENV_CHECKPOINT_DIR: spec.checkpoint.path,
        c.ENV_RUN_DIR: RUN_DIR,
        c.ENV_METRICS_PORT: str(spec.metrics.port),
        c.ENV_TERMINATION_LOG: c.DEFAULT_TERMINATION_LOG,
    }
    if ctx.uid:  # names the checkpoint writer with the attempt: a replaced gang is fenced off
        env[c.ENV_JOB_UID] = ctx.uid
    if ctx.allow_cpu_fallback:
        env[c.ENV_ALLOW_CPU_FALLBACK] = "true"
    if nproc == 1:
        # One process per pod: the pod is the rank. With nproc > 1 the trainer spawns
        # local ranks itself and derives RANK = NODE_RANK * NPROC_PER_NODE + LOCAL_RANK.
        env[c.ENV_RANK] = str(node_rank * nproc)
        env[c.ENV_LOCAL_RANK] = "0"
    env.update(extra or {})
    return env


def _merge_env(ours: dict[str, str], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """User entries win: an env var set in workers.template is never overridden."""
    user_names = {e.get("name") for e in user}
    return [*user, *(e for e in env_list(ours) if e["name"] not in user_names)]


def _merge_named(ours: list[dict[str, Any]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {u.get("name") for u in user}
    return [*(o for o in ours if o.get("name") not in names), *user]


def build_pod(
    spec: JobSpec,
    ctx: BuildContext,
    *,
    role: str,
    index: int,
    env: dict[str, str],
    hostname: str | None = None,
    subdomain: str | None = None,
    ports: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """One hardened pod running the trainer image, with workers.template merged in.

    The template contributes only what pod_rules allows (validation refuses the rest, naming
    the field; here it is left out), and the security fields are set after the merge: the
    pod meets the restricted Pod Security Standard whatever the spec says."""
    template: dict[str, Any] = copy.deepcopy(pod_rules.allowed_template(spec.workers.template))
    name = pod_name(ctx.name, role, index)
    nproc = spec.workers.procs_per_worker
    container_ports = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in (ports or [])]
    for local in range(nproc):
        port_name = METRICS_PORT_NAME if local == 0 else f"{METRICS_PORT_NAME}-{local}"
        container_ports.append({"name": port_name, "containerPort": spec.metrics.port + local, "protocol": "TCP"})
    tmp_mount = {"name": "tmp", "mountPath": c.TMP_MOUNT_DIR}
    # A pod that writes no checkpoint (a federated client) may read the volume (model.init), never change
    # it: whatever it left there would be read by the writer that resumes (checkpoint_access.py).
    writer = checkpoint_access.writes_checkpoints(spec.mode, role, index)
    checkpoint_mount: dict[str, Any] = {"name": "checkpoints", "mountPath": spec.checkpoint.path}
    if not writer:
        checkpoint_mount["readOnly"] = True
    volume_mounts = [
        {"name": "config", "mountPath": c.CONFIG_MOUNT_DIR, "readOnly": True},
        checkpoint_mount,
        {"name": "run", "mountPath": RUN_DIR},
        tmp_mount,
    ]
    data_source = dict(spec.data.volume)
    if data_source and pod_rules.volume_source_error(data_source) is not None:
        data_source = {}  # validation refuses it; never mount what it would refuse
    if data_source:
        # Read-only: every rank of every pod maps the same files; none may change them under the others.
        volume_mounts.insert(2, {"name": "dataset", "mountPath": spec.data.mount_path, "readOnly": True})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": ctx.image,
        "imagePullPolicy": ctx.image_pull_policy,
        "ports": container_ports,
        "resources": resources(spec),
        "volumeMounts": volume_mounts,
        # The default path: rank 0 writes its summary JSON there and the operator reads it
        # from the pod status; on failure the log tail explains why.
        "terminationMessagePath": c.DEFAULT_TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # User container overrides (image, command, args, env, volumeMounts) for the trainer
    # container; other entries are sidecars.
    user_containers = list(template.pop("containers", []) or [])
    user_container: dict[str, Any] = {}
    for i, uc in enumerate(user_containers):
        if uc.get("name", CONTAINER) == CONTAINER or (i == 0 and "name" not in uc):
            user_container = dict(uc)
            user_containers.pop(i)
            break
    user_env = list(template.pop("env", []) or []) + list(user_container.pop("env", []) or [])
    container["env"] = _merge_env({**WRITABLE_ENV, **env}, user_env)
    taken = {e.get("name") for e in container["env"]}
    store_env = object_store_env(spec, writes_checkpoints=writer)
    container["env"] += [e for e in store_env if e["name"] not in taken]  # the user's own env wins
    user_mounts = list(template.pop("volumeMounts", []) or []) + list(user_container.pop("volumeMounts", []) or [])
    container["volumeMounts"] = _merge_named(volume_mounts, user_mounts)
    user_container.pop("name", None)
    container.update(user_container)
    sidecars = [{**uc, "volumeMounts": _merge_named([tmp_mount], list(uc.get("volumeMounts") or []))}
                for uc in user_containers]
    for one in (container, *sidecars):
        one["securityContext"] = copy.deepcopy(CONTAINER_SECURITY)

    checkpoint_source = checkpoint_storage.volume_source(spec, ctx.name)
    volumes = [
        {"name": "config", "configMap": {"name": config_map_name(ctx.name)}},
        {"name": "checkpoints", **checkpoint_source},
        *([{"name": "dataset", **data_source}] if data_source else []),
        {"name": "run", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    tolerations: list[dict[str, Any]] = []
    gpu_placement: dict[str, Any] = {}
    if spec.workers.resources.gpus > 0:
        tolerations.append({"key": c.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        tolerations.extend(dict(t) for t in ctx.gpu.tolerations)
        if ctx.gpu.node_selector:
            gpu_placement["nodeSelector"] = dict(ctx.gpu.node_selector)
        if ctx.gpu.runtime_class_name:
            gpu_placement["runtimeClassName"] = ctx.gpu.runtime_class_name
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator restarts whole gangs, never single ranks
        # The trainer checkpoints its step on SIGTERM and exits within this (process/stop_request.py).
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
        "containers": [container, *sidecars],
        "volumes": _merge_named(volumes, list(template.pop("volumes", []) or [])),
        "tolerations": tolerations + list(template.pop("tolerations", []) or []),
        **gpu_placement,
    }
    if hostname:
        pod_spec["hostname"] = hostname
    if subdomain:
        pod_spec["subdomain"] = subdomain
    user_labels = dict(template.pop("labels", {}) or {})
    user_annotations = dict(template.pop("annotations", {}) or {})
    for key, value in template.items():  # nodeSelector, affinity, priorityClassName, ...
        if isinstance(value, dict) and isinstance(pod_spec.get(key), dict):
            pod_spec[key] = {**pod_spec[key], **value}
        else:
            pod_spec[key] = value
    if not pod_spec["tolerations"]:
        del pod_spec["tolerations"]
    pod_spec.update(
        enableServiceLinks=False,  # no service env vars leaking into the trainer's env
        automountServiceAccountToken=False,  # the trainer never talks to the API
        securityContext={
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            # A large checkpoint volume is chowned once, not on every pod start.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    )
    meta = metadata(ctx, name, {**user_labels, **pod_labels(ctx.name, role, index, ctx.attempt)})
    if user_annotations:
        meta["annotations"] = user_annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
