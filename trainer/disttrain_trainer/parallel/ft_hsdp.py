"""Fault-tolerant HSDP: a replica group shards the model over its own processes with FSDP2
(parallel/fsdp.py, reduce-scatter inside the group), and the groups replicate it through torchft.

FSDP2 leaves every process with the mean gradient of its group's batches for its own shard. The
processes of the same group rank in the other groups hold the same shard, so one all-reduce per
step among them (torchft's Manager: the quorum's replica groups, each process with its peers of
the same group rank) makes it the mean over the quorum, which the optimizer then steps on. The
shards travel as one flat buffer: one collective per step, not one per parameter.

A joining replica group receives its peers' state shard by shard (torchft's checkpoint transport
connects each process to the one of the same group rank in a live group). The transport carries
plain tensors, not DTensors (whose device mesh names process groups of the sender), so the state
is sent as local shards (`local_state`) and put back into this process's DTensors on arrival
(`load_local_model`, `load_local_optimizer`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from .ft_ddp import FTComm


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of `t`: its shard of a DTensor, else `t` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def local_params(model: nn.Module) -> Iterator[torch.Tensor]:
    for p in model.parameters():
        yield local(p.detach())


def allreduce_gradients(model: nn.Module, comm: FTComm) -> None:
    """Average this process's gradient shards over the quorum (FTComm.sum_over_quorum), timed in
    `comm`. After a failed all-reduce the gradients hold garbage and the step is not committed
    (the Manager's should_commit is False), as with the DDP hook (ft_ddp.py)."""
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [local(p.grad) if p.grad is not None else None for p in params]
    # A parameter without a gradient (unused this step) sends zeros: every peer's buffer has the same layout.
    parts = [g.reshape(-1) if g is not None else torch.zeros(local(p).numel(), dtype=local(p).dtype, device=local(p).device)
             for p, g in zip(params, grads, strict=True)]  # fmt: skip
    if not parts:
        return
    flat = torch.cat(parts)
    # The mean, divided before the sum as DDP's all-reduce does.
    flat.div_(max(1, comm.manager.num_participants()))
    comm.sum_over_quorum([flat])
    offset = 0
    for g, part in zip(grads, parts, strict=True):
        n = part.numel()
        if g is not None:
            g.copy_(flat[offset:offset + n].view_as(g))
        offset += n
    comm.allreduce_s += time.perf_counter() - start
    comm.bytes += flat.numel() * flat.element_size()


def local_state(tree: Any) -> Any:
    """`tree` (a state dict: dicts, lists, tuples of tensors and values) with every DTensor replaced
    by this process's shard of it."""
    if isinstance(tree, DTensor):
        return tree.to_local().detach()
    if isinstance(tree, dict):
        return {k: local_state(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(local_state(v) for v in tree)
    return tree


@torch.no_grad()
def load_local_model(model: nn.Module, shards: dict[str, torch.Tensor]) -> None:
    """A peer's `local_state(model.state_dict())` into this process's shards, in place."""
    own = model.state_dict()
    missing = sorted(set(own) - set(shards))
    if missing:
        raise ValueError(f"the peer's model state lacks {missing[:5]}")
    for name, target in own.items():
        dst = local(target)
        src = shards[name]
        if src.shape != dst.shape:
            raise ValueError(f"{name}: the peer's shard has shape {tuple(src.shape)}, this process's {tuple(dst.shape)}")
        dst.copy_(src)


def load_local_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """A peer's `local_state(optimizer.state_dict())` into `optimizer`: per-parameter tensors shaped
    like a sharded parameter's shard become DTensors like it again (Adam's moments, SGD's momentum);
    scalars (Adam's step) stay as they are."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    rebuilt: dict[int, dict[str, Any]] = {}
    for key, entry in state["state"].items():
        p = params[int(key)]
        rebuilt[key] = {name: _like(p, v) for name, v in entry.items()}
    optimizer.load_state_dict({"state": rebuilt, "param_groups": state["param_groups"]})


def _like(p: torch.Tensor, v: Any) -> Any:
    if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == p.to_local().shape:
        return DTensor.from_local(v.to(p.device), p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())  # fmt: skip
    return v
