"""mode: tensor — intra-layer (Megatron) parallel: a gang on one DeviceMesh dimension.
Tensor parallel is chatty (an all-reduce per layer), so its ranks want one pod with
procsPerWorker = tensor degree; the gang shape is the same."""

from __future__ import annotations

from disttrain_api.model import JobSpec

from .common import BuildContext, Children
from .gang import build_gang, mesh_annotation


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    return build_gang(spec, ctx, annotations=mesh_annotation(spec, ctx))
