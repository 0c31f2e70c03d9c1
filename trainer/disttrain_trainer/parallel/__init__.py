"""Parallel modes behind one shape: `apply(model, *, mesh, cfg) -> model`, its communication clock and a train step.

data with ddp: DistributedDataParallel, communication timed by DDP's reducer
(data.py). tensor, hybrid with pipeline 1 and data with fsdp: the job's
DeviceMesh (mesh.py), tensor-parallel plans (tensor.py), FSDP2 or replicate
over the data dimension (fsdp.py), the step profiled for its communication
(comm_profile.py). pipeline, and hybrid with pipeline > 1 (data x pipeline x tensor),
run their own loop (pipeline_train.py) over stages built in pipeline.py /
pipedream.py, each stage module sharded by its blocks' tensor-parallel plans.
Other modes stop with exit code 2 and a message saying so (see __main__).
"""

from __future__ import annotations

import functools

from disttrain_api.model import JobSpec
from torch import nn

from ..config import TrainerConfig
from ..dist_env import DistContext
from . import data as data_parallel
from . import hybrid
from .comm_profile import ProfiledComm
from .data import CommClock, CommTimes, StepResult
from .hybrid import is_sharded
from .mesh import Layout, build_mesh, layout_for

IMPLEMENTED = ("data", "pipeline", "tensor", "hybrid")


class ModeNotImplemented(RuntimeError):
    def __init__(self, mode: str):
        super().__init__(
            f"mode {mode!r} is not implemented by this trainer yet (implemented: {', '.join(IMPLEMENTED)})"
        )


def runs_pipeline(spec: JobSpec) -> bool:
    """Whether the job runs the pipeline loop (pipeline_train.py) instead of this module's modes."""
    return spec.mode == "pipeline" or (spec.mode == "hybrid" and spec.parallelism.pipeline > 1)


def on_mesh(cfg: TrainerConfig) -> bool:
    """Whether the mode runs on the DeviceMesh (DTensor parameters) rather than plain DDP."""
    spec = cfg.spec
    if runs_pipeline(spec):
        return False
    return spec.mode in ("tensor", "hybrid") or spec.parallelism.data_strategy == "fsdp"


def layout(cfg: TrainerConfig) -> Layout:
    return layout_for(cfg.spec, cfg.world_size)


def data_shard(cfg: TrainerConfig, rank: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel degree): ranks of one tensor/pipeline group read the same rows."""
    lay = layout(cfg)
    return rank // (lay.pp * lay.tp), lay.dp


def rng_stream(cfg: TrainerConfig, rank: int) -> int:
    """The RNG stream index of `rank`: shared inside a tensor-parallel group, whose replicated
    activations (outside the parallel regions) must see the same dropout masks."""
    return rank // layout(cfg).tp


def apply(model: nn.Module, *, mesh: DistContext, cfg: TrainerConfig) -> nn.Module:
    """Wrap `model` for cfg.spec.mode (the pipeline modes build their stages in pipeline_train.py)."""
    mode = cfg.spec.mode
    if mode not in IMPLEMENTED or runs_pipeline(cfg.spec):
        raise ModeNotImplemented(mode)
    if on_mesh(cfg):
        lay = layout(cfg)
        return hybrid.apply_layout(model, mesh=build_mesh(lay, mesh.device.type), layout=lay, device=mesh.device)
    return data_parallel.wrap_ddp(model, ctx=mesh, training=cfg.spec.training)


def comm_clock_for(model: nn.Module) -> CommClock | ProfiledComm | None:
    """The communication clock of a wrapped model; None when it does not communicate gradients."""
    if isinstance(model, data_parallel.DDP):
        return CommClock(model)
    if is_sharded(model):
        return ProfiledComm()
    return None


def train_step_for(model: nn.Module, comm: CommClock | ProfiledComm | None = None):  # noqa: ANN201 - returns the mode's train_step function
    """The train step of a wrapped model; a sharded one's step runs under `comm` when it is a ProfiledComm."""
    if is_sharded(model):
        return functools.partial(hybrid.train_step, comm=comm if isinstance(comm, ProfiledComm) else None)
    return data_parallel.train_step


__all__ = [
    "IMPLEMENTED",
    "CommClock",
    "CommTimes",
    "Layout",
    "ModeNotImplemented",
    "ProfiledComm",
    "StepResult",
    "apply",
    "comm_clock_for",
    "data_shard",
    "is_sharded",
    "layout",
    "on_mesh",
    "rng_stream",
    "runs_pipeline",
    "train_step_for",
]
