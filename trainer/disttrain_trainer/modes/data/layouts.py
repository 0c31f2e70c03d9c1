"""The layouts of the data mode behind one shape: `apply(model, *, mesh, cfg) -> model`, its
communication clock and its train step.

data with ddp: DistributedDataParallel, communication timed by DDP's reducer
(parallel/ddp.py). tensor, hybrid without a pipeline and data with fsdp: the job's
DeviceMesh (parallel/mesh.py), tensor-parallel plans (parallel/tensor.py), FSDP2 or
replicate over the data dimension (parallel/fsdp.py), the step profiled for its
communication (parallel/comm_profile.py). A pipeline (mode pipeline, hybrid with
pipeline > 1) is the pipeline mode's (modes/pipeline/).
"""

from __future__ import annotations

import functools

from torch import nn

from ...parallel import ddp, float8, hybrid, sync
from ...parallel.block_compile import apply_compile
from ...parallel.comm_profile import ProfiledComm
from ...parallel.ddp import CommClock
from ...parallel.hybrid import is_sharded
from ...parallel.mesh import Layout, build_mesh, layout_for
from ...process.config import TrainerConfig
from ...process.dist_env import DistContext


def on_mesh(cfg: TrainerConfig) -> bool:
    """Whether the mode runs on the DeviceMesh (DTensor parameters) rather than plain DDP."""
    spec = cfg.spec
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
    """Wrap `model` for cfg.spec.mode: float8, tensor parallelism, compile, then the data dimension
    (parallel/block_compile.py says why in this order). With training.sync localsgd / diloco it
    stays a plain module (rank 0's weights on every rank), synchronised every interval steps
    (parallel/sync.py)."""
    spec = cfg.spec
    tr = spec.training
    if tr.float8:
        float8.check_device(mesh.device)
        float8.apply_float8(model, fsdp=on_mesh(cfg) and spec.parallelism.data_strategy == "fsdp", name=spec.model.name)
    if tr.sync.kind != "every-step":
        if tr.compile_mode is not None:
            apply_compile(model, tr.compile_mode, name=spec.model.name)
        return sync.replicate(model.to(mesh.device))
    if on_mesh(cfg):
        lay = layout(cfg)
        return hybrid.apply_layout(model, mesh=build_mesh(lay, mesh.device.type), layout=lay, device=mesh.device,
                                   compile_mode=tr.compile_mode)  # fmt: skip
    if tr.compile_mode is not None:
        apply_compile(model, tr.compile_mode, name=spec.model.name)
    return ddp.wrap_ddp(model, ctx=mesh, training=tr)


def comm_clock_for(model: nn.Module) -> CommClock | ProfiledComm | None:
    """The communication clock of a wrapped model; None when it does not communicate gradients."""
    if isinstance(model, ddp.DDP):
        return CommClock(model)
    if is_sharded(model):
        return ProfiledComm()
    return None


def train_step_for(model: nn.Module, comm: CommClock | ProfiledComm | None = None):  # noqa: ANN201 - returns the mode's train_step function
    """The train step of a wrapped model; a sharded one's step runs under `comm` when it is a ProfiledComm."""
    if is_sharded(model):
        return functools.partial(hybrid.train_step, comm=comm if isinstance(comm, ProfiledComm) else None)
    return ddp.train_step
