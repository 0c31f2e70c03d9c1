"""The data dimension of the mesh: FSDP2 (`fully_shard`) or replication, composable with TP.

fsdp: ZeRO-3 style. Each transformer/MLP block is its own FSDP unit, then the
root (embeddings, head): a unit's parameters are all-gathered just before its
forward and freed after, gradients are reduce-scattered, and the optimizer
steps on the local shard only. Parameters that tensor parallelism already made
DTensors on the "tp" mesh become 2-D (dp-sharded, tp-sharded) DTensors.

ddp with tensor parallelism: `replicate` (DDP semantics on FSDP2's machinery)
accepts DTensor parameters where `DistributedDataParallel` does not; pure data
parallel keeps `DistributedDataParallel` and its comm hooks (parallel/ddp.py).
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded as units of their own: the model's `fsdp_units()` (a Hugging Face
    model's transformer blocks, hf_models.py), else the children of its `blocks` Sequential."""
    if callable(getattr(model, "fsdp_units", None)):
        return list(model.fsdp_units())
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.Sequential) else []


def shard(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    for unit in units(model):
        fully_shard(unit, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def replicate_over(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    replicate(model, mesh=dp_mesh)
    return model

