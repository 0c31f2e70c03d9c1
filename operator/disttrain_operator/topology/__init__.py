"""One topology module per mode, all behind `build(spec, ctx) -> Children`."""

from __future__ import annotations

from collections.abc import Callable

from disttrain_api import constants as c
from disttrain_api.model import JobSpec

from . import data, federated, hybrid, networkpolicy, paramserver, pipeline, tensor
from .common import BuildContext, Children

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
    return children


def gang_role(mode: str) -> str:
    """The role of the pods that make up the gang (whose success is the job's success)."""
    return c.ROLE_CLIENT if mode == "federated" else c.ROLE_WORKER


__all__ = ["BUILDERS", "BuildContext", "Children", "build_children", "gang_role"]
