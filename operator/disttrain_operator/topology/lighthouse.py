"""spec.faultTolerance in mode data: every worker pod a replica group of its own, and the job's
lighthouse (torchft's quorum server) as a Deployment + ClusterIP Service owned by the job.

One lighthouse per job, not one per operator: its quorum rule (minReplicas) and its heartbeat
timeout are lighthouse-wide settings, and they are the job's; a shared one would also hold every
job's replicas in one failure domain and would let one job's pods reach another's quorum (its
dashboard can kill any replica it knows). It keeps no state worth saving: a restarted lighthouse
learns the replicas again from their heartbeats, so a Deployment (restarted by Kubernetes) fits.

A replica pod's env differs from a gang pod's: MASTER_ADDR is the pod's own DNS name (its group's
store, and where peers reach its manager, its checkpoint server and the all-reduce's store),
WORLD_SIZE its processes and NODE_RANK 0 (its own group's world: one process, or an HSDP group of
workers.procsPerWorker sharding the model), DISTTRAIN_FT_REPLICA its index, TORCHFT_LIGHTHOUSE the
Service. The pods stay behind the
job's headless Service, so each has that name; the gang's NetworkPolicy already admits the job's
own pods on every port (gloo and torchft pick theirs at random), and the lighthouse's admits the
replicas on its port only.
"""

from __future__ import annotations

import dataclasses

from disttrain_api import constants as c
from disttrain_api.model import JobSpec, Quantity

from . import common, networkpolicy
from .common import BuildContext, Children

PORT_NAME = "lighthouse"
# Quorum bookkeeping only (no model, no data): a small pod, whatever the workers ask for.
CPU, MEMORY = "250m", "512Mi"


def service_name(job: str) -> str:
    return f"{job}-{c.ROLE_LIGHTHOUSE}"


def address(ctx: BuildContext) -> str:
    return f"http://{common.service_fqdn(service_name(ctx.name), ctx.namespace)}:{c.DEFAULT_LIGHTHOUSE_PORT}"


def replica_env(ctx: BuildContext, procs: int, index: int) -> dict[str, str]:
    """What replica pod `index`'s env changes from a gang pod's (see the module doc); `procs` its
    processes (workers.procsPerWorker: with more than one, the pod's launcher spawns them)."""
    host = common.fqdn(common.pod_name(ctx.name, c.ROLE_WORKER, index), common.service_name(ctx.name), ctx.namespace)
    env = {c.ENV_MASTER_ADDR: host, c.ENV_WORLD_SIZE: str(procs), c.ENV_NODE_RANK: "0",
           c.ENV_FT_REPLICA: str(index), c.ENV_FT_LIGHTHOUSE: address(ctx)}  # fmt: skip
    if procs == 1:
        env |= {c.ENV_RANK: "0", c.ENV_LOCAL_RANK: "0"}
    return env


def add_lighthouse(children: Children, spec: JobSpec, ctx: BuildContext) -> None:
    """The job's lighthouse: its Deployment, Service and NetworkPolicy (the replicas' env: replica_env)."""
    small = dataclasses.replace(spec, workers=dataclasses.replace(
        spec.workers, resources=dataclasses.replace(spec.workers.resources, gpus=0, cpu=Quantity(CPU),
                                                    memory=Quantity(MEMORY))))  # fmt: skip
    world = ctx.replicas * spec.workers.procs_per_worker
    env = common.contract_env(small, ctx, node_rank=0, world_size=world, master_addr="127.0.0.1",
                              extra={c.ENV_ROLE: c.ROLE_LIGHTHOUSE, c.ENV_FT_LIGHTHOUSE: address(ctx)})  # fmt: skip
    pod = common.build_pod(small, ctx, role=c.ROLE_LIGHTHOUSE, index=0, env=env,
                           ports=[(PORT_NAME, c.DEFAULT_LIGHTHOUSE_PORT)])  # fmt: skip
    name = service_name(ctx.name)
    labels = {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: c.ROLE_LIGHTHOUSE}
    children.deployments.append(common.build_server_deployment(spec, ctx, name, pod, labels))
    svc = common.build_cluster_service(ctx, name, c.ROLE_LIGHTHOUSE, PORT_NAME, c.DEFAULT_LIGHTHOUSE_PORT)
    svc["spec"]["selector"] = dict(labels)
    children.services.insert(0, svc)
    children.network_policies.append(networkpolicy.build_server_policy(
        spec, ctx, server_role=c.ROLE_LIGHTHOUSE, gang_role=c.ROLE_WORKER, port=c.DEFAULT_LIGHTHOUSE_PORT))  # fmt: skip
