"""Tensor parallel on 2 gloo processes equals the dense single-process model (1e-5).

Each rank builds the dense model and a copy, shards the copy with the trainer's
plan, runs the same batch through both and compares loss, logits and every
parameter gradient (gathered with full_tensor). loss_parallel's cross-entropy is
compared with the ordinary one directly as well.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from disttrain_trainer.models import GPT, MLP
from disttrain_trainer.parallel.tensor import apply_tensor_parallel
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

WORLD = 2
TOL = 1e-5


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _compare(dense: torch.nn.Module, tp: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lm: bool) -> None:
    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1)) if lm else F.cross_entropy(logits, y)

    ref_logits = dense(x)
    ref = loss_of(ref_logits)
    ref.backward()
    with loss_parallel():
        logits = tp(x)
        loss = loss_of(logits)
        loss.backward()
    if lm:
        assert isinstance(logits, DTensor) and logits.placements == (Shard(2),), "GPT logits must stay vocab-sharded"
    torch.testing.assert_close(_full(loss), ref, atol=TOL, rtol=0)
    torch.testing.assert_close(_full(logits), ref_logits, atol=TOL, rtol=0)
    grads = dict(tp.named_parameters())
    sharded = 0
    for name, p in dense.named_parameters():
        q = grads[name]
        sharded += isinstance(q, DTensor) and any(isinstance(pl, Shard) for pl in q.placements)
        torch.testing.assert_close(_full(q.grad), p.grad, atol=TOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert sharded > 0


def _mesh():  # noqa: ANN202
    return init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))


def _gpt(sequence_parallel: bool) -> None:
    mesh = _mesh()
    torch.manual_seed(0)
    dense = GPT(vocab=37, block_size=16, dim=32, layers=2, heads=4, dropout=0.0, act_ckpt="none")
    tp = apply_tensor_parallel(copy.deepcopy(dense), mesh, sequence_parallel=sequence_parallel)
    x, y = torch.randint(0, 37, (3, 16)), torch.randint(0, 37, (3, 16))
    _compare(dense, tp, x, y, lm=True)


def _mlp(layers: int) -> None:
    mesh = _mesh()
    torch.manual_seed(0)
    dense = MLP(inputs=64, hidden=32, layers=layers, classes=10, dropout=0.0, act_ckpt="none")
    tp = apply_tensor_parallel(copy.deepcopy(dense), mesh, sequence_parallel=False)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    _compare(dense, tp, x, y, lm=False)


def _loss_parallel() -> None:
    mesh = _mesh()
    torch.manual_seed(1)
    logits = torch.randn(12, 10, requires_grad=True)
    y = torch.randint(0, 10, (12,))
    ref = F.cross_entropy(logits, y)
    ref.backward()
    leaf = distribute_tensor(logits.detach(), mesh, [Shard(1)]).requires_grad_()
    with loss_parallel():
        loss = F.cross_entropy(leaf, y)
        loss.backward()
    torch.testing.assert_close(_full(loss), ref, atol=TOL, rtol=0)
    torch.testing.assert_close(_full(leaf.grad), logits.grad, atol=TOL, rtol=0)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_gpt_tensor_parallel_equals_dense(gloo, sequence_parallel: bool) -> None:  # noqa: ANN001
    gloo(_gpt, WORLD, sequence_parallel)


@pytest.mark.parametrize("layers", [2, 3])
def test_mlp_tensor_parallel_equals_dense(gloo, layers: int) -> None:  # noqa: ANN001
    gloo(_mlp, WORLD, layers)


def test_loss_parallel_equals_cross_entropy(gloo) -> None:  # noqa: ANN001
    gloo(_loss_parallel, WORLD)
