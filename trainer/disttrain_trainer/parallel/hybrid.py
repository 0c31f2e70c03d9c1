"""Modes on the DeviceMesh: tensor, hybrid (DP x TP), and data with FSDP.

`apply_layout` shards a plain module for a `Layout`: tensor parallelism first
(over mesh["tp"]), then the data dimension (FSDP2 or replicate over
mesh["dp"]), the order torchtitan uses so FSDP wraps the TP DTensors. The train
step is data parallel's, run inside `loss_parallel` so that a GPT's
vocabulary-sharded logits meet a vocabulary-parallel cross-entropy (forward and
backward must both be inside the context).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from ..process.config import ConfigError
from ..process.precision import Amp
from . import ddp as data_parallel
from . import fsdp
from .block_compile import apply_compile
from .comm_profile import ProfiledComm
from .mesh import Layout
from .tensor import apply_tensor_parallel


def apply_layout(model: nn.Module, *, mesh: DeviceMesh, layout: Layout, device: torch.device,
                 compile_mode: str | None = None) -> nn.Module:  # fmt: skip
    """Tensor parallelism, then each block compiled (`compile_mode`), then the data dimension
    (parallel/block_compile.py says why in this order)."""
    if layout.pp > 1:
        raise ConfigError(
            f"parallelism.pipeline {layout.pp} with tensor or FSDP is not implemented by this trainer yet "
            "(implemented: data x tensor with ddp or fsdp)"
        )
    model = model.to(device)
    if layout.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=layout.sequence_parallel)
    if compile_mode is not None:
        apply_compile(model, compile_mode)
    if layout.data_strategy == "fsdp":
        fsdp.shard(model, mesh["dp"])
    elif layout.dp > 1:
        fsdp.replicate_over(model, mesh["dp"])
    return model


def is_sharded(model: nn.Module) -> bool:
    """True when some parameter is a DTensor: every rank must take part in forward (eval too)."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def data_gradient_bytes(model: nn.Module, layout: Layout) -> int:
    """Gradient bytes this rank reduces over the data dimension per step (0 without one):
    each parameter's tensor-parallel shard, which FSDP then reduce-scatters."""
    if layout.dp == 1:
        return 0
    total = 0
    for p in model.parameters():
        n = p.numel()
        if isinstance(p, DTensor):
            mesh, names = p.device_mesh, p.device_mesh.mesh_dim_names or ()
            for i, placement in enumerate(p.placements):
                if placement.is_shard() and i < len(names) and names[i] == "tp":
                    n //= mesh.size(i)
        total += n * p.element_size()
    return total


def train_step(
    model: nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    amp: Amp,
    comm: ProfiledComm | None,
) -> data_parallel.StepResult:
    """Data parallel's step inside `loss_parallel`, profiled by `comm` (None: metrics off).

    With gradAccumulation > 1, FSDP/replicate reduce gradients on every micro-step
    (correct, more traffic); DDP's no_sync has no equivalent wired here."""
    with comm.step() if comm is not None else contextlib.nullcontext(), loss_parallel():
        res = data_parallel.train_step(model, micro_batches, loss_fn=loss_fn, optimizer=optimizer,
                                       scheduler=scheduler, amp=amp)  # fmt: skip
    if isinstance(res.loss, DTensor):  # loss_parallel's loss is replicated: no communication here
        res = dataclasses.replace(res, loss=res.loss.full_tensor())
    return res
