"""A model as ordered pipeline blocks: the units the partitioner assigns to stages.

The contract for a model a pipeline can cut (built-in or `module:factory`):
  - an `nn.Sequential`: its children are the blocks, in order; or
  - any module with a `pipeline_blocks()` method returning the ordered blocks,
    such that applying them in turn equals `model(x)`.
Each block takes one tensor and returns one tensor (what crosses a stage
boundary). Blocks share their parameters with the model, so the model's
initialisation (same seed on every rank) is what every stage starts from.

Block state is always full tensors, whatever the layout: a tensor-parallel
block's DTensors are gathered (collective over their tensor-parallel group) when
read and this rank's shard is cut again when loaded, so one checkpoint loads
into any pipeline x tensor split.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..process.config import ConfigError


def split_blocks(model: nn.Module, *, name: str = "model") -> list[nn.Module]:
    if isinstance(model, nn.Sequential):
        blocks = list(model)
    elif callable(getattr(model, "pipeline_blocks", None)):
        blocks = list(model.pipeline_blocks())
    else:
        raise ConfigError(
            f"model.name {name!r}: a pipeline needs an nn.Sequential or a model with a pipeline_blocks() "
            f"method returning its ordered blocks; {type(model).__name__} has neither"
        )
    if not blocks:
        raise ConfigError(f"model.name {name!r} has no blocks to split into stages")
    return blocks


@torch.no_grad()
def check_chain(model: nn.Module, blocks: Sequence[nn.Module], x: torch.Tensor, *, name: str = "model") -> None:
    """The blocks applied in turn to `x` give `model(x)` (eval mode: no dropout, no RNG drawn);
    otherwise a ConfigError naming the block that breaks the chain, before any stage is built."""
    was_training = model.training
    model.eval()
    try:
        out = x
        for i, block in enumerate(blocks):
            shape = list(out.shape)
            try:
                out = block(out)
            except Exception as e:  # noqa: BLE001 - whatever it raises, it raises on every retry
                raise ConfigError(
                    f"model.name {name!r}: pipeline block {i} ({type(block).__name__}) fails on a tensor of shape "
                    f"{shape} (the previous block's output): {type(e).__name__}: {str(e).strip()[:300]}"
                ) from None
            if not isinstance(out, torch.Tensor):
                raise ConfigError(f"model.name {name!r}: pipeline block {i} ({type(block).__name__}) returns "
                                  f"{type(out).__name__}; each block must return one tensor")  # fmt: skip
        whole = model(x)
    finally:
        model.train(was_training)
    if out.shape != whole.shape or not torch.allclose(out.float(), whole.float(), rtol=1e-4, atol=1e-5):
        raise ConfigError(f"model.name {name!r}: its pipeline blocks applied in turn do not compute model(x) "
                          f"(shape {list(out.shape)} vs {list(whole.shape)}); pipeline_blocks() must list every "
                          "step of forward, in order")  # fmt: skip


def block_state(blocks: Sequence[nn.Module], ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """State of the given blocks keyed by global block index ("3.attn.qkv.weight"): independent of the split."""
    return {f"{k}.{n}": _full(t) for k in ids for n, t in blocks[k].state_dict().items()}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _like(target: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`full` laid out like `target`: a DTensor target gets this rank's shard, cut locally
    (every rank holds the same full tensor, so no rank needs to send it)."""
    if not isinstance(target, DTensor):
        return full
    return distribute_tensor(full.to(target.device, target.dtype), target.device_mesh, target.placements,
                             src_data_rank=None)  # fmt: skip


def load_block_state(blocks: Sequence[nn.Module], ids: Sequence[int], state: dict[str, torch.Tensor]) -> None:
    for k in ids:
        prefix = f"{k}."
        own = blocks[k].state_dict()
        part = {n[len(prefix):]: t for n, t in state.items() if n.startswith(prefix)}
        blocks[k].load_state_dict({n: _like(own[n], t) if n in own else t for n, t in part.items()})


def named_block_params(blocks: Sequence[nn.Module], ids: Sequence[int]) -> list[tuple[str, nn.Parameter]]:
    return [(f"{k}.{n}", p) for k in ids for n, p in blocks[k].named_parameters()]
