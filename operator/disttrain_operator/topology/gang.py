"""A gang of worker pods behind one headless Service: the shape shared by every
collective mode (data, pipeline, tensor, hybrid). Rank 0 is
`<job>-worker-0.<job>.<ns>.svc.cluster.local`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import JobSpec

from . import common
from .common import BuildContext, Children


def master_addr(ctx: BuildContext) -> str:
    host = common.pod_name(ctx.name, c.ROLE_WORKER, 0)
    return common.fqdn(host, common.service_name(ctx.name), ctx.namespace)


def build_gang(spec: JobSpec, ctx: BuildContext, *, annotations: dict[str, str] | None = None,
               extra_env: Callable[[int], dict[str, str]] | None = None) -> Children:  # fmt: skip
    """`extra_env(index)`: what pod `index`'s env adds or changes (the user's own env still wins)."""
    world = ctx.replicas * spec.workers.procs_per_worker
    pods: list[dict[str, Any]] = []
    for index in range(ctx.replicas):
        env = common.contract_env(spec, ctx, node_rank=index, world_size=world, master_addr=master_addr(ctx),
                                  extra=extra_env(index) if extra_env else None)  # fmt: skip
        pod = common.build_pod(
            spec,
            ctx,
            role=c.ROLE_WORKER,
            index=index,
            env=env,
            hostname=common.pod_name(ctx.name, c.ROLE_WORKER, index),
            subdomain=common.service_name(ctx.name),
            ports=[(common.DIST_PORT_NAME, c.DEFAULT_MASTER_PORT)],
        )
        pod["metadata"]["labels"][c.LABEL_MODE] = spec.mode
        if annotations:
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        pods.append(pod)
    return Children(
        config_maps=[common.build_config_map(spec, ctx)],
        services=[
            common.build_headless_service(
                ctx, c.ROLE_WORKER, [(common.DIST_PORT_NAME, c.DEFAULT_MASTER_PORT), ("metrics", spec.metrics.port)]
            )
        ],
        pods=pods,
    )


def mesh_annotation(spec: JobSpec, ctx: BuildContext) -> dict[str, str]:
    world = ctx.replicas * spec.workers.procs_per_worker
    tp, pp = spec.parallelism.tensor, spec.parallelism.pipeline
    return {c.ANNOTATION_MESH: f"dp={max(world // (tp * pp), 1)},pp={pp},tp={tp}"}
