"""mode: data — synchronous data parallel (DDP all-reduce): a gang of identical ranks; with
spec.faultTolerance, replica groups of one pod each (one process, or an HSDP group of
procsPerWorker) and the job's lighthouse (lighthouse.py)."""

from __future__ import annotations

import functools

from disttrain_api.model import JobSpec

from .common import BuildContext, Children
from .gang import build_gang, mesh_annotation
from .lighthouse import add_lighthouse, replica_env


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    if not spec.fault_tolerant:
        return build_gang(spec, ctx, annotations=mesh_annotation(spec, ctx))
    children = build_gang(spec, ctx, annotations=mesh_annotation(spec, ctx),
                          extra_env=functools.partial(replica_env, ctx, spec.workers.procs_per_worker))  # fmt: skip
    add_lighthouse(children, spec, ctx)
    return children
