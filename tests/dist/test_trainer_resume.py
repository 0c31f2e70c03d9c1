"""Exact resume with real trainer processes: dropout (RNG streams), PowerSGD (error feedback),
and a corrupt newest checkpoint that every rank falls back from together."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt

STEPS = 30


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def final_model(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return ckpt.load(result.checkpoint_dir, STEPS)["model"]


def spec_with(make_digits_spec, **over: Any) -> dict[str, Any]:  # noqa: ANN001
    # No LR decay: a run stopped at step 20 follows the same schedule as one of 30 steps.
    return make_digits_spec(
        optimizer={"decay": "none", "warmupSteps": 0},
        checkpoint={"intervalSteps": 10, "keep": 5},
        **over,
    )


@pytest.mark.parametrize(
    "case",
    [
        {"model": {"dropout": 0.3}},
        {"training": {"gradientCompression": "powersgd", "powerSGDRank": 1}},
    ],
    ids=["dropout", "powersgd"],
)
def test_stop_and_resume_equals_uninterrupted(trainer, make_digits_spec, case) -> None:  # noqa: ANN001
    full = spec_with(make_digits_spec, **case)
    full["training"] = {**full["training"], "steps": STEPS}
    ref = trainer.run(full, world=2, job="ref")

    # The same job stopped after 20 steps, then continued to 30 from its step-20 checkpoint.
    short = {**full, "training": {**full["training"], "steps": 20}}
    trainer.run(short, world=2, job="resumed")
    resumed = trainer.run(full, world=2, job="resumed")
    assert resumed.summary["resumedFromStep"] == 20 and resumed.summary["steps"] == STEPS
    # Dropout masks differ per rank and per step, PowerSGD's residuals per rank: only
    # restoring each rank's own state reproduces the uninterrupted parameters.
    assert max_diff(final_model(ref), final_model(resumed)) <= 1e-6


def test_a_corrupt_newest_checkpoint_makes_every_rank_fall_back_to_the_previous(
    trainer, make_digits_spec
) -> None:  # noqa: ANN001
    spec = spec_with(make_digits_spec, training={"steps": STEPS})
    first = trainer.run(spec, world=2, job="corrupt")
    root = first.checkpoint_dir
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [10, 20, 30]
    expected = final_model(first)
    newest = root / ckpt.name_for(STEPS) / ckpt.STATE_FILE
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3])  # a torn write on a volume without atomic rename

    again = trainer.run(spec, world=2, job="corrupt")
    assert again.summary["resumedFromStep"] == 20, again.outputs[0][-2000:]
    assert again.summary["replicaMaxAbsDiff"] == 0.0
    # Both ranks trained steps 21..30 again from the same state: the same parameters as before.
    assert max_diff(expected, final_model(again)) <= 1e-6
