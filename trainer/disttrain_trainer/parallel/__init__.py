"""Parallel modes behind one shape: `apply(model, *, mesh, cfg) -> model` plus a train step.

data with ddp: DistributedDataParallel with timed comm hooks (data.py). tensor,
hybrid and data with fsdp: the job's DeviceMesh (mesh.py), tensor-parallel
plans (tensor.py), FSDP2 or replicate over the data dimension (fsdp.py), the
step profiled for its communication (comm_profile.py). Other modes stop with
exit code 2 and a message saying so (see __main__).
"""

from __future__ import annotations

import functools

from torch import nn

from ..config import TrainerConfig
from ..dist_env import DistContext
from . import data as data_parallel
from . import hybrid
from .comm_profile import ProfiledComm
from .data import CommTimer, StepResult
from .hybrid import is_sharded
from .mesh import Layout, build_mesh, layout_for

IMPLEMENTED = ("data", "tensor", "hybrid")


class ModeNotImplemented(RuntimeError):
    def __init__(self, mode: str):
        super().__init__(
            f"mode {mode} is not implemented by this trainer yet (implemented: {', '.join(IMPLEMENTED)})"
        )


def on_mesh(cfg: TrainerConfig) -> bool:
    """Whether the mode runs on the DeviceMesh (DTensor parameters) rather than plain DDP."""
    return cfg.spec.mode in ("tensor", "hybrid") or cfg.spec.parallelism.data_strategy == "fsdp"


def layout(cfg: TrainerConfig) -> Layout:
    return layout_for(cfg.spec, cfg.world_size)


def data_shard(cfg: TrainerConfig, rank: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel degree): ranks of one tensor/pipeline group read the same rows."""
    lay = layout(cfg)
    return rank // (lay.pp * lay.tp), lay.dp


def seed_rank(cfg: TrainerConfig, rank: int) -> int:
    """The RNG stream index of `rank`: shared inside a tensor-parallel group, whose replicated
    activations (outside the parallel regions) must see the same dropout masks."""
    return rank // layout(cfg).tp


def apply(
    model: nn.Module, *, mesh: DistContext, cfg: TrainerConfig
) -> tuple[nn.Module, CommTimer | ProfiledComm]:
    """Wrap `model` for cfg.spec.mode; returns the wrapped model and its communication timer."""
    mode = cfg.spec.mode
    if mode not in IMPLEMENTED:
        raise ModeNotImplemented(mode)
    if on_mesh(cfg):
        lay = layout(cfg)
        device_mesh = build_mesh(lay, mesh.device.type)
        return hybrid.apply_layout(model, mesh=device_mesh, layout=lay, device=mesh.device), ProfiledComm()
    return data_parallel.wrap_ddp(model, ctx=mesh, training=cfg.spec.training)


def train_step_for(mode: str, timer: CommTimer | ProfiledComm | None = None):  # noqa: ANN201 - returns the mode's train_step function
    if isinstance(timer, ProfiledComm):
        return functools.partial(hybrid.train_step, comm=timer)
    if mode == "data":
        return data_parallel.train_step
    raise ModeNotImplemented(mode)


__all__ = [
    "IMPLEMENTED",
    "CommTimer",
    "ModeNotImplemented",
    "ProfiledComm",
    "StepResult",
    "apply",
    "data_shard",
    "is_sharded",
    "on_mesh",
    "seed_rank",
    "train_step_for",
]
