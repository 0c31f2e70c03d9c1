"""training.sync diloco against every-step data parallel: real trainer processes on gloo, the same
samples. DiLoCo trains (its loss falls), ends within a stated tolerance of every-step DDP, leaves
the replicas on one model, and moves H x fewer bytes (the runs' communication metrics); with
sync.everyStepFirst it is DDP to the bit until then."""

from __future__ import annotations

import shutil

import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt_files

pytestmark = pytest.mark.dist

H = 10
STEPS = 60
# Test accuracy of DiLoCo after 60 steps within this of every-step DDP's on digits (measured: ~0.01).
ACCURACY_TOLERANCE = 0.06


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_diloco_trains_near_every_step_ddp_with_h_times_fewer_bytes(trainer, make_digits_spec) -> None:
    base = {"steps": STEPS, "logIntervalSteps": 10}
    ddp = trainer.run(make_digits_spec(training=base, checkpoint={"intervalSteps": STEPS}), world=2, job="every")
    dil = trainer.run(make_digits_spec(training={**base, "sync": {"kind": "diloco", "interval": H}},
                                       checkpoint={"intervalSteps": STEPS}), world=2, job="diloco")  # fmt: skip
    a, b = ddp.summary, dil.summary
    assert (a["sync"], a["syncEvery"], b["sync"], b["syncEvery"]) == ("every-step", 1, "diloco", H)
    losses = [r["loss"] for r in dil.steps_log()]
    assert losses[-1] < 0.5 * losses[0], losses
    assert b["testAccuracy"] >= a["testAccuracy"] - ACCURACY_TOLERANCE, (a["testAccuracy"], b["testAccuracy"])
    assert b["replicaMaxAbsDiff"] == 0.0  # the replicas end on one model
    assert a["commBytes"] == H * b["commBytes"] > 0
    # The metrics say the same: the bytes counted per log interval (disttrain_gradient_bytes_total).
    moved = [sum(r["gradient_bytes"] * r["steps"] for r in run.steps_log()) for run in (ddp, dil)]
    assert moved[0] == pytest.approx(H * moved[1], rel=0.01)


def test_every_step_first_trains_as_ddp_then_steps_apart_and_resumes_exactly_at_the_switch(
        trainer, make_digits_spec) -> None:  # fmt: skip
    """sync.everyStepFirst: the first steps are DDP's to the bit, the replicas then step apart from
    that model, the bytes are one model per every-step step and per sync, and a run resumed from the
    checkpoint at the switch (every replica's state identical there) ends where the uninterrupted one does."""
    first = 20
    base = {"steps": STEPS, "logIntervalSteps": 10}
    ckpt = {"intervalSteps": first, "keep": 5}
    ddp = trainer.run(make_digits_spec(training=base, checkpoint=ckpt), world=2, job="every")
    sync = {"kind": "diloco", "interval": H, "everyStepFirst": first}
    spec = make_digits_spec(training={**base, "sync": sync}, checkpoint=ckpt)
    dil = trainer.run(spec, world=2, job="first")
    model_at = lambda run, step: ckpt_files.load(run.checkpoint_dir, step)["model"]  # noqa: E731
    assert max_diff(model_at(ddp, first), model_at(dil, first)) == 0.0  # DDP's steps, bit for bit
    assert max_diff(model_at(ddp, 2 * first), model_at(dil, 2 * first)) > 0.0  # then apart
    # ... from that model: the anchor the pseudo-gradients are taken against, the outer momentum fresh.
    saved = ckpt_files.load(dil.checkpoint_dir, first)["sync"]
    reached = model_at(dil, first)
    assert [torch.equal(a, reached[k]) for a, k in zip(saved["anchor"], reached, strict=True)] == [True] * len(reached)
    assert saved["outer"]["state"] == {}
    s, per_model = dil.summary, ddp.summary["commBytes"] // STEPS
    assert (s["sync"], s["everyStepFirst"], s["replicaMaxAbsDiff"]) == ("diloco", first, 0.0)
    syncs = (STEPS - first) // H
    assert s["commBytes"] == (first + syncs) * per_model
    moved = sum(r["gradient_bytes"] * r["steps"] for r in dil.steps_log())
    assert moved == pytest.approx((first + syncs) * per_model, rel=0.01)
    assert s["testAccuracy"] >= ddp.summary["testAccuracy"] - ACCURACY_TOLERANCE
    # Resumed from the switch's checkpoint: the anchor and the (fresh) outer state come from it.
    target = trainer.ckpt_root / "resumed"
    target.mkdir(parents=True)
    shutil.copytree(dil.checkpoint_dir / ckpt_files.name_for(first), target / ckpt_files.name_for(first))
    resumed = trainer.run(spec, world=2, job="resumed")
    assert resumed.summary["resumedFromStep"] == first
    assert max_diff(model_at(resumed, STEPS), model_at(dil, STEPS)) == 0.0


def _plain_backward_after_ddp() -> None:
    import torch.distributed as dist  # noqa: PLC0415 - in the gloo worker
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415

    torch.manual_seed(0)
    inner = torch.nn.Linear(4, 1)
    wrapped = DDP(inner)
    x = torch.full((2, 4), float(dist.get_rank() + 1))  # rank r's gradient: 2 (r + 1) per weight
    wrapped(x).sum().backward()
    assert torch.equal(inner.weight.grad, torch.full((1, 4), 3.0))  # DDP's mean of 2 and 4
    inner.zero_grad()
    inner(x).sum().backward()  # what a step after everyStepFirst runs: the module, DDP still alive
    assert torch.equal(inner.weight.grad, torch.full((1, 4), 2.0 * (dist.get_rank() + 1)))
    del wrapped


def test_a_module_stepping_after_its_ddp_steps_all_reduces_nothing(gloo) -> None:  # noqa: ANN001
    """The switch at sync.everyStepFirst calls the module DDP wrapped: DDP's gradient hooks must stay
    idle then (they act only after DDP's own forward), or the replicas would not step apart."""
    gloo(_plain_backward_after_ddp, 2)
