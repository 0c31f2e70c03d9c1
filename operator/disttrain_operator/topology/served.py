"""The client/server shape shared by federated and paramserver modes: a server
Deployment (restarted by Kubernetes if it crashes) behind a ClusterIP Service
speaking gRPC, plus a gang of client pods that dial it by its Service name."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import JobSpec

from . import common
from .common import BuildContext, Children


def server_name(job: str, role: str) -> str:
    return f"{job}-{role}"


def build_served(
    spec: JobSpec,
    ctx: BuildContext,
    *,
    server_role: str,
    client_role: str,
    port_name: str,
    port: int,
) -> Children:
    svc_name = server_name(ctx.name, server_role)
    server_addr = f"{common.service_fqdn(svc_name, ctx.namespace)}:{port}"
    world = ctx.replicas * spec.workers.procs_per_worker

    # The server needs no accelerator: it averages / holds parameters on CPU.
    server_spec = dataclasses.replace(
        spec,
        workers=dataclasses.replace(spec.workers, resources=dataclasses.replace(spec.workers.resources, gpus=0)),
    )
    server_env = common.contract_env(
        server_spec, ctx, node_rank=0, world_size=world, master_addr=server_addr.rsplit(":", 1)[0],
        extra={c.ENV_ROLE: server_role, c.ENV_SERVER_ADDR: server_addr},
    )
    server_pod = common.build_pod(
        server_spec, ctx, role=server_role, index=0, env=server_env, ports=[(port_name, port)]
    )
    labels = {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: server_role}
    template_meta = {k: v for k, v in server_pod["metadata"].items() if k in ("labels", "annotations")}
    template_meta["labels"] = {**template_meta["labels"], c.LABEL_MODE: spec.mode}
    pod_spec = copy.deepcopy(server_pod["spec"])
    pod_spec["restartPolicy"] = "Always"  # a Deployment's pods always restart
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(ctx, svc_name, {**labels, c.LABEL_MODE: spec.mode}),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            # Recreate: two servers would split the clients between two models.
            "strategy": {"type": "Recreate"},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }

    pods: list[dict[str, Any]] = []
    for index in range(ctx.replicas):
        env = common.contract_env(
            spec, ctx, node_rank=index, world_size=world, master_addr=server_addr.rsplit(":", 1)[0],
            extra={c.ENV_ROLE: client_role, c.ENV_SERVER_ADDR: server_addr},
        )
        pod = common.build_pod(
            spec,
            ctx,
            role=client_role,
            index=index,
            env=env,
            hostname=common.pod_name(ctx.name, client_role, index),
            subdomain=common.service_name(ctx.name),
        )
        pod["metadata"]["labels"][c.LABEL_MODE] = spec.mode
        pods.append(pod)
    return Children(
        config_maps=[common.build_config_map(spec, ctx)],
        services=[
            common.build_cluster_service(ctx, svc_name, server_role, port_name, port),
            common.build_headless_service(ctx, client_role, [("metrics", spec.metrics.port)]),
        ],
        deployments=[deployment],
        pods=pods,
    )
