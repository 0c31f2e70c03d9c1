"""Checkpoints with real trainer processes: kill mid-write, resume == uninterrupted, world size 2 -> 1."""

from __future__ import annotations

import shutil

import torch
from disttrain_api import constants as C
from disttrain_trainer import checkpoint as ckpt


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def final_model(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    loaded = ckpt.load_latest(result.checkpoint_dir)
    assert loaded is not None
    return loaded[1]["model"]


def test_kill_during_checkpoint_write_then_resume_equals_uninterrupted(
    trainer, make_digits_spec
) -> None:
    steps = {"steps": 40, "logIntervalSteps": 5}
    ref = trainer.run(
        make_digits_spec(training=steps, checkpoint={"intervalSteps": 40}), world=2, job="ref"
    )

    spec = make_digits_spec(training=steps, checkpoint={"intervalSteps": 10, "keep": 5})
    # Rank 0 SIGKILLs itself halfway through writing the step-30 checkpoint.
    crashed = trainer.run(
        spec, world=2, job="crash", env={C.ENV_FAULT_KILL_IN_CHECKPOINT: "30"}, expect_ok=False
    )
    assert crashed.returncodes[0] == -9, crashed.outputs[0][-2000:]
    assert crashed.returncodes[1] != 0
    root = crashed.checkpoint_dir
    partial = [p for p in root.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)]
    assert partial, "the fault hook should have left a half-written temp dir"
    assert (partial[0] / ckpt.STATE_FILE).stat().st_size > 0
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [10, 20]
    step, state = ckpt.load_latest(root)  # type: ignore[misc]
    assert step == 20 and state["step"] == 20 and state["sampler"]["offset"] > 0

    resumed = trainer.run(spec, world=2, job="crash")
    assert resumed.summary["resumedFromStep"] == 20
    assert not [p for p in root.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)], (
        "partial dir not cleaned"
    )
    assert max_diff(final_model(ref), final_model(resumed)) < 1e-6


def test_checkpoint_from_world_size_2_resumes_at_world_size_1(trainer, make_digits_spec) -> None:
    steps = {"steps": 40, "logIntervalSteps": 5}
    spec = make_digits_spec(training=steps, checkpoint={"intervalSteps": 20})
    ref = trainer.run(spec, world=2, job="w2")  # uninterrupted, writes step 20 and 40
    # Start a world-size-1 job from the step-20 checkpoint of the world-size-2 job.
    target = trainer.ckpt_root / "w1"
    target.mkdir(parents=True)
    shutil.copytree(ref.checkpoint_dir / ckpt.name_for(20), target / ckpt.name_for(20))
    one = trainer.run(spec, world=1, job="w1")
    assert one.summary["resumedFromStep"] == 20 and one.summary["worldSize"] == 1
    # Same global batches, same optimizer state: the continuation matches the 2-process run.
    assert max_diff(final_model(ref), final_model(one)) < 1e-5
