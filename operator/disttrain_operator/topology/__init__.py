"""One topology module per mode, all behind `build(spec, ctx) -> Children`."""

from __future__ import annotations

from collections.abc import Callable

from disttrain_api import constants as c
from disttrain_api.model import JobSpec, ParamServerSpec

from . import (
    checkpoint_claim,
    data,
    federated,
    hybrid,
    lighthouse,
    networkpolicy,
    paramserver,
    pipeline,
    tensor,
)
from .common import BuildContext, Children
from .served import server_names

Builder = Callable[[JobSpec, BuildContext], Children]

BUILDERS: dict[str, Builder] = {
    "data": data.build,
    "pipeline": pipeline.build,
    "tensor": tensor.build,
    "hybrid": hybrid.build,
    "federated": federated.build,
    "paramserver": paramserver.build,
}


def build_children(spec: JobSpec, ctx: BuildContext) -> Children:
    children = BUILDERS[spec.mode](spec, ctx)
    children.network_policies.insert(0, networkpolicy.build_gang_policy(spec, ctx, gang_role(spec.mode)))
    claim = checkpoint_claim.build_claim(spec, ctx)
    if claim is not None:
        children.claims.append(claim)
    return children


def gang_role(mode: str) -> str:
    """The role of the pods that make up the gang (whose success is the job's success)."""
    return c.ROLE_CLIENT if mode == "federated" else c.ROLE_WORKER


def server_deployments(spec: JobSpec, job: str) -> list[str]:
    """Names of the job's server Deployments (federated aggregator, parameter-server shards, the
    lighthouse of fault-tolerant replicas)."""
    if spec.mode == "federated":
        return server_names(job, c.ROLE_AGGREGATOR, 1)
    if spec.mode == "paramserver":
        return server_names(job, c.ROLE_SERVER, (spec.param_server or ParamServerSpec()).shards)
    if spec.fault_tolerant:
        return [lighthouse.service_name(job)]
    return []


__all__ = ["BUILDERS", "BuildContext", "Children", "build_children", "gang_role", "server_deployments"]
