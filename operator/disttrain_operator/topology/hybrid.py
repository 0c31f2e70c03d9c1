"""mode: hybrid — data x pipeline x tensor on a 3-D DeviceMesh: one gang; the mesh
annotation records the layout the trainer derives from WORLD_SIZE and parallelism."""

from __future__ import annotations

from disttrain_api.model import JobSpec

from .common import BuildContext, Children
from .gang import build_gang, mesh_annotation


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    return build_gang(spec, ctx, annotations=mesh_annotation(spec, ctx))
