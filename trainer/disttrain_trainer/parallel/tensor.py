"""Tensor (intra-layer) parallel plans, Megatron-LM style, applied with `parallelize_module`.

A plan maps module names to `torch.distributed.tensor.parallel` styles; PyTorch
inserts the collectives (Megatron's f and g operators): a column-parallel linear
takes a replicated input (backward all-reduces its gradient) and produces
output features split over the ranks; the row-parallel linear after it consumes
that split and all-reduces its partial sums. One all-reduce per attention and
one per MLP in forward, the same in backward.

GPT: QKV column-parallel (heads split; the fused projection is laid out per head,
see models.CausalSelfAttention), output projection row-parallel; MLP up
column-parallel, down row-parallel; the token embedding vocab-parallel
(RowwiseParallel on an embedding shards the vocabulary rows and masks ids
outside a rank's range); the LM head column-parallel with logits left sharded
over the vocabulary as a DTensor, for `loss_parallel` cross-entropy: full
logits are never gathered.

Sequence parallelism (Korthikanti et al. 2022): between the tensor-parallel
regions the residual stream is split along the sequence (each rank holds its
tokens' rows as a plain local tensor, as in torchtitan), layer norms run on
their shard, and each region starts with an all-gather and ends with a
reduce-scatter instead of an all-reduce.

User models (`module:factory`) bring their own plan: the module defines
`tensor_parallel_plan(self, *, sequence_parallel: bool) -> Mapping[str, ParallelStyle]`
(see README, "Tensor-parallel plans").
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..config import ConfigError
from ..models import GPT, MLP

PLAN_METHOD = "tensor_parallel_plan"


def gpt_plan(model: GPT, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    sp = sequence_parallel
    # Between regions the stream is Shard(1) (sequence) with SP, Replicate without.
    between = Shard(1) if sp else Replicate()
    plan: dict[str, ParallelStyle] = {
        # Replicated output: the position embedding (a plain replicated parameter) is added next.
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head": ColwiseParallel(
            input_layouts=between, output_layouts=Shard(-1), use_local_output=False
        ),
    }
    if sp:
        # Cut the replicated embedding output into this rank's tokens (no communication).
        plan["blocks.0"] = PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
        )
        plan["ln_f"] = SequenceParallel()
    for i in range(len(model.blocks)):
        b = f"blocks.{i}"
        plan[f"{b}.attn.qkv"] = ColwiseParallel()
        plan[f"{b}.attn.proj"] = RowwiseParallel(output_layouts=between)
        plan[f"{b}.mlp.0"] = ColwiseParallel()
        plan[f"{b}.mlp.2"] = RowwiseParallel(output_layouts=between)
        if sp:
            plan[f"{b}.ln1"] = SequenceParallel()
            plan[f"{b}.ln2"] = SequenceParallel()
            for region in ("attn", "mlp"):
                # The all-gather that opens a region (Megatron's g in sequence-parallel form).
                plan[f"{b}.{region}"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
    return plan


def mlp_plan(model: MLP, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Column/row pairs along the chain stem -> blocks -> head.

    A head that would start a new pair stays replicated: classifier logits are
    small, and a replicated head keeps the ordinary cross-entropy."""
    if sequence_parallel:
        raise ConfigError(
            "parallelism.sequenceParallel needs a sequence dimension; model mlp has none"
        )
    chain = ["stem.0", *(f"blocks.{i}.0" for i in range(len(model.blocks))), "head"]
    plan: dict[str, ParallelStyle] = {}
    for i, name in enumerate(chain):
        if i % 2:
            plan[name] = RowwiseParallel()
        elif i + 1 < len(chain):
            plan[name] = ColwiseParallel()
    return plan


def plan_for(model: nn.Module, *, sequence_parallel: bool) -> Mapping[str, ParallelStyle]:
    if isinstance(model, GPT):
        return gpt_plan(model, sequence_parallel=sequence_parallel)
    if isinstance(model, MLP):
        return mlp_plan(model, sequence_parallel=sequence_parallel)
    method = getattr(model, PLAN_METHOD, None)
    if method is None:
        raise ConfigError(
            f"model {type(model).__name__} has no tensor-parallel plan: built-in plans exist for gpt and "
            f"mlp; a 'module:factory' model must define {PLAN_METHOD}(self, *, sequence_parallel) "
            "returning {module name: ParallelStyle} (see README)"
        )
    plan = method(sequence_parallel=sequence_parallel)
    names = dict(model.named_modules())
    missing = [k for k in plan if "*" not in k and k not in names]
    if missing:
        raise ConfigError(
            f"{type(model).__name__}.{PLAN_METHOD} names modules the model does not have: {missing}"
        )
    return plan


def check_divisible(model: nn.Module, tp: int) -> None:
    """Heads and the MLP width must split evenly (the API checks the spec; this guards the module)."""
    if isinstance(model, GPT):
        attn = model.blocks[0].attn
        heads = attn.qkv.out_features // (3 * attn.head_dim)
        if heads % tp:
            raise ConfigError(f"model.heads {heads} is not divisible by parallelism.tensor {tp}")


def megatron_bytes_per_step(*, batch: int, seq: int, hidden: int, layers: int, elem: int) -> int:
    """All-reduce payload of one GPT training step under this plan (no sequence parallel).

    Megatron-LM: per block 2 all-reduces of the [b, s, h] activations in forward
    (after attention and after the MLP, the g operator) and 2 in backward (the
    input gradients of QKV and of the MLP's up projection, the f operator); plus
    the vocab-parallel embedding's forward all-reduce and the LM head's input
    gradient. loss_parallel's reductions are [b, s]-sized and counted apart."""
    return (4 * layers + 2) * batch * seq * hidden * elem


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool
) -> nn.Module:
    """Shard `model` in place over `tp_mesh` (1-D) and return it."""
    check_divisible(model, tp_mesh.size())
    return parallelize_module(model, tp_mesh, dict(plan_for(model, sequence_parallel=sequence_parallel)))
