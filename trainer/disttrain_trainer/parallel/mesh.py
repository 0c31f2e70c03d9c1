"""The DeviceMesh of a job: data x pipeline x tensor, from the spec's degrees.

Dimension order is ("dp", "pp", "tp") with tensor innermost, so the ranks of one
tensor-parallel group are consecutive: with procsPerWorker = tensor they share a
pod (a fast link), which matters because tensor parallelism communicates in every
layer while data parallelism communicates once per step (torchtitan's
`parallel_dims.py` orders its mesh the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

from disttrain_api.model import JobSpec
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..process.config import ConfigError

DIMS = ("dp", "pp", "tp")


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp: int
    pp: int
    tp: int
    data_strategy: str  # "ddp" | "fsdp"
    sequence_parallel: bool

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def describe(self) -> str:
        return f"dp={self.dp},pp={self.pp},tp={self.tp}"


def layout_for(spec: JobSpec, world_size: int) -> Layout:
    """The degrees for this world size; an error names the fields when they do not fit.

    The API validates the spec's own world size; the launcher may start a
    different one (an elastic resize), so the check is repeated against WORLD_SIZE."""
    par = spec.parallelism
    inner = par.tensor * par.pipeline
    if world_size % inner:
        raise ConfigError(
            f"world size {world_size} is not divisible by parallelism.tensor {par.tensor} x "
            f"parallelism.pipeline {par.pipeline} = {inner}; change the degrees or workers.replicas"
        )
    return Layout(
        dp=world_size // inner,
        pp=par.pipeline,
        tp=par.tensor,
        data_strategy=par.data_strategy,
        sequence_parallel=par.sequence_parallel,
    )


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """One 3-D mesh over the whole world; size-1 dimensions are kept so `mesh["tp"]` always exists."""
    return init_device_mesh(
        device_type, (layout.dp, layout.pp, layout.tp), mesh_dim_names=DIMS
    )
