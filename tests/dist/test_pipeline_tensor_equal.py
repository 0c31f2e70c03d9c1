"""Pipeline x tensor (and data x pipeline x tensor) trains like one process with the same global batch.

A small GPT cut into pipeline stages, each stage module sharded over the
tensor-parallel ranks (parallel/tensor.py's block plans), driven by PyTorch's
schedules over mesh["pp"]; data-parallel replicas average their stages'
gradients over mesh["dp"]. After a few AdamW steps every rank gathers its
blocks' full tensors and compares them with one process. float64 as in
test_hybrid_equal.py: the layouts sum in another order than one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from disttrain_trainer.models import GPT, MLP
from disttrain_trainer.modes.pipeline.loop import average_over_data
from disttrain_trainer.modes.pipeline.partition import Plan, uniform_bounds
from disttrain_trainer.modes.pipeline.schedules import Pipeline, total_stages
from disttrain_trainer.parallel.blocks import block_state, split_blocks
from disttrain_trainer.parallel.mesh import Layout, build_mesh
from disttrain_trainer.parallel.tensor import stage_sharder
from torch.distributed.tensor import DTensor

TOL = 1e-9
VOCAB, SEQ, BATCH, STEPS, MICROBATCHES = 29, 8, 8, 2, 2
FEATURES, CLASSES = 12, 5


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        # Blocks stem|0|1|2|head, column/row-parallel in turn: the cut after block 1 (column) sends
        # each rank's feature shard to the next stage.
        return MLP(FEATURES, 16, 4, CLASSES, 0.0, "none").to(torch.float64)
    model = GPT(vocab=VOCAB, block_size=SEQ, dim=16, layers=2, heads=4, dropout=0.0, act_ckpt="none")
    return model.to(torch.float64)


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _batches(kind: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    if kind == "mlp":
        return [(torch.randn(BATCH, FEATURES, generator=gen, dtype=torch.float64),
                 torch.randint(0, CLASSES, (BATCH,), generator=gen)) for _ in range(STEPS)]  # fmt: skip
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen), torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen))
            for _ in range(STEPS)]  # fmt: skip


def _reference(kind: str) -> dict[str, torch.Tensor]:
    model = _model(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in _batches(kind):
        opt.zero_grad()
        _loss(model(x), y).backward()
        opt.step()
    blocks = split_blocks(model)
    return block_state(blocks, range(len(blocks)))


def _check(layout: Layout, schedule: str, virtual: int, kind: str) -> None:
    ref = _reference(kind)
    mesh = build_mesh(layout, "cpu")
    dp_rank, pp_rank = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    model = _model(kind)
    blocks = split_blocks(model)
    bounds = uniform_bounds(len(blocks), total_stages(schedule, layout.pp, virtual))
    plan = Plan(method="uniform", bounds=bounds, stage_seconds=tuple(0.0 for _ in bounds))
    shard = stage_sharder(model, mesh["tp"], sequence_parallel=layout.sequence_parallel)
    pipe = Pipeline(blocks, plan, schedule=schedule, microbatches=MICROBATCHES, virtual=virtual, pp_rank=pp_rank,
                    pp_size=layout.pp, group=mesh["pp"].get_group(), device=torch.device("cpu"), loss_fn=_loss,
                    shard_stage=shard)  # fmt: skip
    params = pipe.parameters()
    assert any(isinstance(p, DTensor) for p in params)  # the stages really are tensor parallel
    opt = torch.optim.AdamW(params, lr=1e-2)
    for x, y in _batches(kind):
        opt.zero_grad()
        pipe.step(x.chunk(layout.dp)[dp_rank], y.chunk(layout.dp)[dp_rank])
        if layout.dp > 1:
            average_over_data(params, mesh["dp"].get_group(), layout.dp)
        opt.step()
    got = block_state(blocks, pipe.block_ids)  # full tensors: gathered over mesh["tp"]
    assert got and all(not isinstance(t, DTensor) for t in got.values())
    for n, t in got.items():
        torch.testing.assert_close(t, ref[n], atol=TOL, rtol=0, msg=lambda m, n=n: f"rank {dist.get_rank()} {n}: {m}")


@pytest.mark.parametrize(
    ("kind", "dp", "sp", "schedule", "virtual"),
    [("gpt", 1, False, "GPipe", 1), ("gpt", 1, False, "1F1B", 1), ("gpt", 1, True, "1F1B", 1),
     ("gpt", 1, False, "Interleaved1F1B", 2), ("gpt", 2, False, "1F1B", 1), ("mlp", 1, False, "1F1B", 1)],
    ids=["gpt-pp2xtp2-gpipe", "gpt-pp2xtp2-1f1b", "gpt-pp2xtp2-sp-1f1b", "gpt-pp2xtp2-interleaved",
         "gpt-dp2xpp2xtp2-1f1b", "mlp-pp2xtp2-1f1b"],
)  # fmt: skip
def test_pipeline_x_tensor_equals_one_process(gloo, kind: str, dp: int, sp: bool, schedule: str, virtual: int) -> None:  # noqa: ANN001
    layout = Layout(dp=dp, pp=2, tp=2, data_strategy="ddp", sequence_parallel=sp)
    gloo(_check, layout.world_size, layout, schedule, virtual, kind)
