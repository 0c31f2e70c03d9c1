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

Under a pipeline, each stage module is sharded with the plans of the blocks it
holds (`block_plans`, `stage_plan`), as torchtitan parallelizes each model part:
what crosses a stage boundary is a plain local tensor (replicated over the
group, or this rank's shard, which goes to the next stage's rank of the same
tensor index), and the last stage's logits stay vocabulary-sharded for
loss_parallel.

Every model brings its plan the same way: the module defines
`tensor_parallel_plan(self, *, sequence_parallel: bool) -> Mapping[str, ParallelStyle]`
(see README, "Tensor-parallel plans"); for a pipeline with tensor parallelism also
`tensor_parallel_block_plans(...)`, and optionally `check_tensor_parallel(self, tp)`. The built-in
gpt and mlp (models.py) define them with the plans below, so this module needs no model class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..process.config import ConfigError

PLAN_METHOD = "tensor_parallel_plan"
BLOCK_PLANS_METHOD = "tensor_parallel_block_plans"
CHECK_METHOD = "check_tensor_parallel"


def _between(sequence_parallel: bool) -> Placement:
    """The residual stream between regions: Shard(1) (sequence) with SP, Replicate without."""
    return Shard(1) if sequence_parallel else Replicate()


def _gpt_tok() -> ParallelStyle:
    # Replicated output: the position embedding (a plain replicated parameter) is added next.
    return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())


def _gpt_head(*, sequence_parallel: bool) -> ParallelStyle:
    return ColwiseParallel(input_layouts=_between(sequence_parallel), output_layouts=Shard(-1), use_local_output=False)


def _gpt_block(prefix: str, *, first: bool, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """One transformer block's styles, its module names under `prefix` ("blocks.3." or "1.")."""
    sp, between = sequence_parallel, _between(sequence_parallel)
    plan: dict[str, ParallelStyle] = {
        f"{prefix}attn.qkv": ColwiseParallel(),
        f"{prefix}attn.proj": RowwiseParallel(output_layouts=between),
        f"{prefix}mlp.0": ColwiseParallel(),
        f"{prefix}mlp.2": RowwiseParallel(output_layouts=between),
    }
    if sp:
        if first:
            # Cut the replicated embedding output into this rank's tokens (no communication).
            plan[prefix.rstrip(".")] = PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
            )
        plan[f"{prefix}ln1"] = SequenceParallel()
        plan[f"{prefix}ln2"] = SequenceParallel()
        for region in ("attn", "mlp"):
            # The all-gather that opens a region (Megatron's g in sequence-parallel form).
            plan[f"{prefix}{region}"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
    return plan


def gpt_plan(model: nn.Module, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    sp = sequence_parallel
    plan: dict[str, ParallelStyle] = {"tok": _gpt_tok(), "head": _gpt_head(sequence_parallel=sp)}
    if sp:
        plan["ln_f"] = SequenceParallel()
    for i in range(len(model.blocks)):
        plan |= _gpt_block(f"blocks.{i}.", first=i == 0, sequence_parallel=sp)
    return plan


def gpt_block_plans(model: nn.Module, *, sequence_parallel: bool) -> list[dict[str, ParallelStyle]]:
    """Per pipeline block (GPT.pipeline_blocks in models.py: embedding, blocks, (ln_f, head))."""
    sp = sequence_parallel
    last: dict[str, ParallelStyle] = {"1": _gpt_head(sequence_parallel=sp)}
    if sp:
        last["0"] = SequenceParallel()
    return [
        {"tok": _gpt_tok()},
        *(_gpt_block("", first=i == 0, sequence_parallel=sp) for i in range(len(model.blocks))),
        last,
    ]


def mlp_plan(model: nn.Module, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Column/row pairs along the chain stem -> blocks -> head.

    A head that would start a new pair stays replicated: classifier logits are
    small, and a replicated head keeps the ordinary cross-entropy."""
    return {name: style for name, style in _mlp_chain(model, sequence_parallel=sequence_parallel) if style}


def _mlp_chain(model: nn.Module, *, sequence_parallel: bool) -> list[tuple[str, ParallelStyle | None]]:
    if sequence_parallel:
        raise ConfigError(
            "parallelism.sequenceParallel needs a sequence dimension; model mlp has none"
        )
    chain = ["stem.0", *(f"blocks.{i}.0" for i in range(len(model.blocks))), "head"]
    styles: list[tuple[str, ParallelStyle | None]] = []
    for i, name in enumerate(chain):
        if i % 2:
            styles.append((name, RowwiseParallel()))
        else:
            styles.append((name, ColwiseParallel() if i + 1 < len(chain) else None))
    return styles


def mlp_block_plans(model: nn.Module, *, sequence_parallel: bool) -> list[dict[str, ParallelStyle]]:
    """Per pipeline block (MLP.pipeline_blocks in models.py: (flatten, stem), blocks, head): a
    column-parallel linear's output crosses a stage boundary as this rank's feature shard."""
    (_, stem), *blocks, (_, head) = _mlp_chain(model, sequence_parallel=sequence_parallel)
    return [
        {"1.0": stem} if stem else {},
        *({"0": style} if style else {} for _, style in blocks),
        {"": head} if head else {},
    ]


def block_plans(model: nn.Module, *, sequence_parallel: bool) -> list[dict[str, ParallelStyle]]:
    """The tensor-parallel plan of each of the model's pipeline blocks (blocks.split_blocks order),
    module names relative to the block: a stage module shards its blocks with these."""
    method = getattr(model, BLOCK_PLANS_METHOD, None)
    if method is None:
        raise ConfigError(
            f"parallelism.tensor with parallelism.pipeline: model {type(model).__name__} has no per-block "
            "tensor-parallel plan (built in for gpt and mlp); use pipeline or tensor alone"
        )
    return list(method(sequence_parallel=sequence_parallel))


def stage_plan(plans: Sequence[Mapping[str, ParallelStyle]], ids: Sequence[int]) -> dict[str, ParallelStyle]:
    """A stage module's plan: nn.Sequential(blocks[ids[0]], blocks[ids[1]], ...) names block j "j"."""
    return {
        f"{j}.{name}" if name else str(j): style for j, k in enumerate(ids) for name, style in plans[k].items()
    }


def plan_for(model: nn.Module, *, sequence_parallel: bool) -> Mapping[str, ParallelStyle]:
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
    """What must split evenly over `tp` ranks does (the API checks the spec; this guards the module)."""
    check = getattr(model, CHECK_METHOD, None)
    if check is not None:
        check(tp)


def check_gpt_heads(model: nn.Module, tp: int) -> None:
    """GPT's attention heads split evenly over the tensor-parallel ranks."""
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


def stage_sharder(
    model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool
) -> Callable[[nn.Module, Sequence[int]], nn.Module]:
    """shard(stage_module, block_ids): a pipeline stage module (nn.Sequential of the model's
    pipeline blocks `block_ids`) sharded in place over `tp_mesh` by its blocks' plans."""
    check_divisible(model, tp_mesh.size())
    plans = block_plans(model, sequence_parallel=sequence_parallel)

    def shard(stage: nn.Module, ids: Sequence[int]) -> nn.Module:
        return parallelize_module(stage, tp_mesh, stage_plan(plans, ids))

    return shard
