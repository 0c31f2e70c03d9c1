"""mode: pipeline — inter-layer model parallel (GPipe/1F1B/PipeDream): a gang whose
ranks are pipeline stages; the stage of a rank is rank % pipeline (trainer side)."""

from __future__ import annotations

from disttrain_api.model import JobSpec

from .common import BuildContext, Children
from .gang import build_gang, mesh_annotation


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    return build_gang(spec, ctx, annotations=mesh_annotation(spec, ctx))
