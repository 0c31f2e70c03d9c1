"""The client/server shape shared by federated and paramserver modes: a server
Deployment (restarted by Kubernetes if it crashes) behind a ClusterIP Service
speaking gRPC, plus a gang of client pods that dial it by its Service name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import JobSpec

from . import common, credentials, networkpolicy
from .common import BuildContext, Children


def server_name(job: str, role: str) -> str:
    return f"{job}-{role}"


def server_names(job: str, role: str, servers: int) -> list[str]:
    """Names of the server Deployments and their Services: one, or one per shard."""
    base = server_name(job, role)
    return [base] if servers == 1 else [f"{base}-{i}" for i in range(servers)]


def build_served(
    spec: JobSpec,
    ctx: BuildContext,
    *,
    server_role: str,
    client_role: str,
    port_name: str,
    port: int,
    servers: int = 1,
) -> Children:
    """`servers` > 1 (parameter-server shards): one Deployment + Service per server, named
    `<job>-<role>-<i>` and selected by replica index; every pod gets all the addresses,
    comma-separated, shard 0 first, and a server finds its own index in NODE_RANK."""
    names = server_names(ctx.name, server_role, servers)
    addrs = [f"{common.service_fqdn(n, ctx.namespace)}:{port}" for n in names]
    server_addr = ",".join(addrs)
    master_addr = addrs[0].rsplit(":", 1)[0]
    world = ctx.replicas * spec.workers.procs_per_worker

    # The server needs no accelerator: it averages / holds parameters on CPU.
    server_spec = dataclasses.replace(
        spec,
        workers=dataclasses.replace(spec.workers, resources=dataclasses.replace(spec.workers.resources, gpus=0)),
    )
    deployments: list[dict[str, Any]] = []
    services: list[dict[str, Any]] = []
    for index, svc_name in enumerate(names):
        server_env = common.contract_env(
            server_spec, ctx, node_rank=index, world_size=world, master_addr=master_addr,
            extra={c.ENV_ROLE: server_role, c.ENV_SERVER_ADDR: server_addr, c.ENV_SERVE_UNTIL_STOPPED: "1"},
        )
        server_pod = common.build_pod(
            server_spec, ctx, role=server_role, index=index, env=server_env, ports=[(port_name, port)]
        )
        labels = {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: server_role}
        if servers > 1:  # each Deployment and Service must select its own shard's pod only
            labels[c.LABEL_REPLICA_INDEX] = str(index)
        deployments.append(common.build_server_deployment(spec, ctx, svc_name, server_pod, labels))
        svc = common.build_cluster_service(ctx, svc_name, server_role, port_name, port)
        svc["spec"]["selector"] = dict(labels)
        services.append(svc)

    pods: list[dict[str, Any]] = []
    for index in range(ctx.replicas):
        env = common.contract_env(
            spec, ctx, node_rank=index, world_size=world, master_addr=master_addr,
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
        services=[*services, common.build_headless_service(ctx, client_role, [("metrics", spec.metrics.port)])],
        deployments=deployments,
        pods=pods,
        network_policies=[networkpolicy.build_server_policy(spec, ctx, server_role=server_role, gang_role=client_role,
                                                            port=port)],  # fmt: skip
    )


def secure_served(children: Children, ctx: BuildContext, *, tls: bool, tls_secret_name: str | None,
                  identities: Sequence[str], pod_identities: Callable[[int], list[str]]) -> None:  # fmt: skip
    """Mint the job's Secrets (credentials.py) into `children` and mount them: every server the TLS
    key pair and the server key, client pod i the CA and the credentials of pod_identities(i)."""
    tls_secret = credentials.tls_secret_name(ctx, tls_secret_name) if tls else None
    servers = [d["metadata"]["name"] for d in children.deployments]
    for deployment in children.deployments:
        credentials.secure_pod(deployment["spec"]["template"]["spec"], ctx, tls_secret=tls_secret, identities=(),
                               server=True)  # fmt: skip
    for pod in children.pods:
        index = int(pod["metadata"]["labels"][c.LABEL_REPLICA_INDEX])
        credentials.secure_pod(pod["spec"], ctx, tls_secret=tls_secret, identities=pod_identities(index), server=False)
    # The Secrets the user did not name; the reconciler creates them once (never replaced).
    if tls and not tls_secret_name:
        children.secrets.append(credentials.build_tls_secret(ctx, servers))
    children.secrets.append(credentials.build_identity_secret(ctx, identities))
