"""mode: data — synchronous data parallel (DDP all-reduce): a gang of identical ranks."""

from __future__ import annotations

from disttrain_api.model import JobSpec

from .common import BuildContext, Children
from .gang import build_gang, mesh_annotation


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    return build_gang(spec, ctx, annotations=mesh_annotation(spec, ctx))
