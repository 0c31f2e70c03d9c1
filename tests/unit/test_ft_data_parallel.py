"""The fault-tolerant data-parallel wrapper (parallel/ft_ddp.py) against plain DDP: its gradient
buckets hold the same parameters in the same order as DDP's, before DDP's rebuild and after it (the
rounding of gloo's ring sum depends on where an element lies in its bucket); a failed all-reduce
leaves the step uncommitted and the layout where it was; gradient accumulation all-reduces once; and
replicas that derive different layouts all fall back to the module-order one.

The Manager here is one replica's view of torchft's (its all-reduce returns a work to wait on):
what is checked is the wrapper's own bookkeeping; four real replicas against plain DDP, bit for bit,
are in tests/dist/test_ft_local.py."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel.ft_ddp import BucketLayout, FTComm, FTDataParallel
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")


class _Work:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def wait(self) -> bool:
        return self.ok  # torchft's managed work: False after a failure, whose error the Manager keeps


class _Manager:
    """`others(tensor, op)` plays the other replicas' part in each all-reduce (default: none)."""

    def __init__(self, participants: int = 1, others: Callable[[torch.Tensor, object], bool] | None = None) -> None:
        self.participants, self.others = participants, others
        self.reduced: list[tuple[int, torch.dtype]] = []  # (elements, dtype) of each all-reduce, in order

    def num_participants(self) -> int:
        return self.participants

    def allreduce(self, t: torch.Tensor, reduce_op: object = None) -> _Work:
        self.reduced.append((t.numel(), t.dtype))
        return _Work(self.others(t, reduce_op) if self.others is not None else True)


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _mlp(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    hidden = [m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), *hidden, nn.Linear(width, 10))


def _gpt() -> nn.Module:
    torch.manual_seed(0)
    return GPT(vocab=64, block_size=16, dim=32, layers=2, heads=4, dropout=0.0, act_ckpt="none")


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).float().pow(2).mean()


def _ddp_buckets(model: nn.Module, x: torch.Tensor, cap_mb: float, steps: int) -> list[list[list[int]]]:
    """Plain DDP's buckets in each of `steps` backward passes, as indices of the trainable parameters."""
    index = {id(p): i for i, p in enumerate(p for p in model.parameters() if p.requires_grad)}
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    seen: list[list[int]] = []

    def record(state, bucket):  # type: ignore[no-untyped-def]  # (DDP checks annotations, which would be strings)
        seen.append([index[id(p)] for p in bucket.parameters()])
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, record)
    out = []
    for _ in range(steps):
        seen.clear()
        _loss(ddp, x).backward()
        out.append(list(seen))
    return out


@pytest.mark.parametrize(
    ("make", "inputs", "cap_mb"),
    [
        (lambda: _mlp(128, 2), lambda: torch.randn(8, 64), 25.0),  # the digits MLP: one bucket
        (lambda: _mlp(1024, 4), lambda: torch.randn(8, 64), 1.0),  # five buckets after the rebuild
        (_gpt, lambda: torch.randint(0, 64, (4, 16)), 0.05),  # embeddings, layer norms, attention
    ],
    ids=["digits-mlp", "mlp-1024x4", "gpt"],
)
def test_buckets_are_laid_out_as_plain_ddp_lays_them_out(world_of_one: None, make: Callable[[], nn.Module],
                                                          inputs: Callable[[], torch.Tensor], cap_mb: float) -> None:  # fmt: skip
    torch.manual_seed(1)
    x = inputs()
    model = make()
    ddp = _ddp_buckets(copy.deepcopy(model), x, cap_mb, steps=3)
    assert ddp[0] != ddp[1] and ddp[1] == ddp[2]  # DDP rebuilt its buckets after the first step

    params = [p for p in model.parameters() if p.requires_grad]
    manager = _Manager()
    ft = FTDataParallel(model, manager, layout=BucketLayout(), bucket_cap_mb=cap_mb)
    for step in range(3):
        manager.reduced.clear()
        _loss(ft, x).backward()
        used = ft.layout.buckets or ft._first  # the layout this backward all-reduced in
        expected = ddp[step]
        assert used == expected, f"step {step}"
        gradients = [(sum(params[i].numel() for i in b), params[0].dtype) for b in expected]
        # Exactly DDP's buckets were all-reduced (and, in the first step, the layout's fingerprint).
        assert manager.reduced[: len(gradients)] == gradients
        assert manager.reduced[len(gradients) :] == ([(2, torch.float64)] if step == 0 else [])
        ft.layout.settle(committed=True)
        for p in params:
            p.grad = None


def test_the_mean_over_the_quorum_is_scaled_before_the_sum() -> None:
    model = _mlp(16, 1)
    local = copy.deepcopy(model)
    _loss(local, torch.ones(2, 64)).backward()

    def three_identical_replicas(t: torch.Tensor, _op: object) -> bool:
        t.mul_(3)  # the sum over three replicas whose gradients equal this one's
        return True

    ft = FTDataParallel(model, _Manager(participants=3, others=three_identical_replicas), layout=BucketLayout(),
                        bucket_cap_mb=25)  # fmt: skip
    _loss(ft, torch.ones(2, 64)).backward()
    for a, b in zip(model.parameters(), local.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_a_failed_all_reduce_leaves_the_step_uncommitted_and_the_layout_where_it_was() -> None:
    def peer_died(t: torch.Tensor, _op: object) -> bool:
        t.fill_(float("nan"))  # what is left in the buffer is garbage; the step is not committed
        return False

    model = _mlp(16, 1)
    ft = FTDataParallel(model, _Manager(participants=2, others=peer_died), layout=BucketLayout(), bucket_cap_mb=25)
    _loss(ft, torch.ones(2, 64)).backward()  # the survivor returns from backward: no exception
    assert all(torch.isnan(p.grad).all() for p in model.parameters())
    assert ft.layout.pending is not None
    ft.layout.settle(committed=False)
    assert ft.layout.buckets is None and ft.layout.pending is None  # the next attempt lays out as the first
    assert ft.comm.take().exposed_s > 0
    assert ft.comm.take_bytes() == sum(p.numel() * 4 for p in model.parameters())


def test_gradient_accumulation_all_reduces_once_per_step() -> None:
    model = _mlp(16, 1)
    local = copy.deepcopy(model)
    manager = _Manager()
    ft = FTDataParallel(model, manager, layout=BucketLayout(), bucket_cap_mb=25)
    batches = [torch.randn(2, 64) for _ in range(3)]
    for i, x in enumerate(batches):
        if i < 2:
            with ft.no_sync():
                _loss(ft, x).backward()
            assert manager.reduced == []
        else:
            _loss(ft, x).backward()
        _loss(local, x).backward()
    assert [n for n, dtype in manager.reduced if dtype == torch.float32] == [sum(p.numel() for p in model.parameters())]
    for a, b in zip(model.parameters(), local.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_replicas_that_derive_different_layouts_keep_the_module_order_one() -> None:
    def another_layout_elsewhere(t: torch.Tensor, op: object) -> bool:
        if op == dist.ReduceOp.MAX:
            t[0] += 1  # another replica's fingerprint is larger
        return True

    model = _mlp(16, 1)
    ft = FTDataParallel(model, _Manager(participants=2, others=another_layout_elsewhere), layout=BucketLayout(),
                        bucket_cap_mb=25)  # fmt: skip
    _loss(ft, torch.ones(2, 64)).backward()
    ft.layout.settle(committed=True)
    assert ft.layout.buckets == ft._first
    # The layout is the run's state: what a joining replica receives, and a checkpoint holds.
    other = BucketLayout()
    other.load_state_dict(ft.layout.state_dict())
    assert other.buckets == ft._first


def test_gradients_are_views_of_their_bucket_and_accumulate_in_place() -> None:
    # zero_grad(set_to_none=False) keeps the views: the next backward accumulates into the bucket
    # itself, and the scaling then applies to the accumulated gradient only once.
    def two_identical_replicas(t: torch.Tensor, _op: object) -> bool:
        t.mul_(2)
        return True

    model = _mlp(16, 1)
    local = copy.deepcopy(model)
    ft = FTDataParallel(model, _Manager(participants=2, others=two_identical_replicas), layout=BucketLayout(),
                        bucket_cap_mb=25)  # fmt: skip
    x1, x2 = torch.randn(2, 64), torch.randn(2, 64)
    _loss(ft, x1).backward()
    ft.layout.settle(committed=True)  # the rebuilt layout: new buckets from the next backward on
    _loss(ft, x1).backward()
    (flat,) = ft._flats
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for g in grads)
    for g in grads:
        g.zero_()  # zero_grad(set_to_none=False)
    _loss(ft, x2).backward()
    _loss(local, x2).backward()
    for a, b in zip(model.parameters(), local.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


class _ReplicaManager:
    """What FTComm.sum_over_quorum asks torchft's Manager when it sums over the group directly."""

    def __init__(self, *, participating: bool = True, error: Exception | None = None) -> None:
        self.participating, self.error, self.quorum_waits = participating, error, 0

    def errored(self) -> Exception | None:
        return self.error

    def wait_quorum(self) -> None:
        self.quorum_waits += 1

    def is_participating(self) -> bool:
        return self.participating

    def report_error(self, e: Exception) -> None:
        self.error = e


class _DeadPeerGroup:
    def allreduce(self, tensors: list[torch.Tensor], opts: object) -> object:
        raise RuntimeError("Connection reset by peer")  # what gloo raises when a peer dies mid-step


def test_sums_go_to_the_replica_group_directly_and_a_failure_votes_the_step_down(world_of_one: None) -> None:
    group = dist.group.WORLD  # a real gloo group (of one: the sum is the tensor itself)
    manager = _ReplicaManager()
    t = torch.arange(4.0)
    FTComm(manager, group=group).sum_over_quorum([t])
    assert torch.equal(t, torch.arange(4.0)) and manager.quorum_waits == 1 and manager.error is None
    healing = _ReplicaManager(participating=False)  # a replica still healing adds nothing
    FTComm(healing, group=group).sum_over_quorum([t])
    assert torch.equal(t, torch.zeros(4))
    failed = _ReplicaManager()
    FTComm(failed, group=_DeadPeerGroup()).sum_over_quorum([torch.ones(2)])  # returns: the survivor goes on
    assert isinstance(failed.error, RuntimeError)  # the Manager holds it: should_commit is False
    sent = torch.ones(2)
    FTComm(failed, group=group).sum_over_quorum([sent])  # after an error nothing more is sent this step
    assert failed.quorum_waits == 1 and torch.equal(sent, torch.ones(2))
