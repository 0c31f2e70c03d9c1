"""Each mesh layout trains like one process with the same global batch.

Two AdamW steps of a small GPT; every data-parallel rank takes its slice of the
global batch, tensor-parallel ranks the same slice. Parameters after the steps
are gathered (full_tensor) and compared with the single-process run. Both run in
float64: the layouts sum gradients in another order than one process, and AdamW's
first steps (update ~ lr * g / |g|) turn float32 rounding of a near-zero gradient
into differences of ~1e-5, which a float32 tolerance cannot tell from a real bug.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel.hybrid import apply_layout
from disttrain_trainer.parallel.mesh import Layout, build_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

TOL = 1e-9
VOCAB, BATCH, STEPS = 29, 8, 2


def _gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(vocab=VOCAB, block_size=8, dim=16, layers=2, heads=4, dropout=0.0, act_ckpt="none")
    return model.to(torch.float64)


def _train(model: torch.nn.Module, dp: int, dp_rank: int) -> dict[str, torch.Tensor]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        x = torch.randint(0, VOCAB, (BATCH, 8), generator=gen)
        y = torch.randint(0, VOCAB, (BATCH, 8), generator=gen)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        opt.zero_grad()
        with loss_parallel():
            logits = model(x)
            F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1)).backward()
        opt.step()
    return {n: p.full_tensor() if isinstance(p, DTensor) else p.detach() for n, p in model.named_parameters()}


def _check(layout: Layout) -> None:
    ref = _train(_gpt(), 1, 0)
    mesh = build_mesh(layout, "cpu")
    model = apply_layout(_gpt(), mesh=mesh, layout=layout, device=torch.device("cpu"))
    got = _train(model, layout.dp, mesh["dp"].get_local_rank())
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=TOL, rtol=0, msg=lambda m, n=n: f"rank {dist.get_rank()} {n}: {m}")


@pytest.mark.parametrize(
    ("dp", "tp", "strategy", "sp"),
    [(2, 1, "fsdp", False), (1, 2, "ddp", True), (2, 2, "fsdp", False), (2, 2, "ddp", True)],
    ids=["fsdp2", "tp2-sp", "fsdp2xtp2", "ddp2xtp2-sp"],
)
def test_layout_equals_one_process(gloo, dp: int, tp: int, strategy: str, sp: bool) -> None:  # noqa: ANN001
    layout = Layout(dp=dp, pp=1, tp=tp, data_strategy=strategy, sequence_parallel=sp)
    gloo(_check, layout.world_size, layout)
