"""mode tensor / hybrid and data with FSDP through `python -m disttrain_trainer` (real gloo processes)."""

from __future__ import annotations

from typing import Any

import pytest
from disttrain_trainer import sharded_checkpoint as sc


def gpt_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": "tensor",
        "parallelism": {"tensor": 2},
        "model": {"name": "gpt", "hidden": 32, "layers": 2, "heads": 4, "blockSize": 16, "dropout": 0.0},
        "data": {"name": "pytext", "batchSize": 8, "seed": 1, "shards": 2},
        "optimizer": {"name": "adamw", "lr": 0.003, "scaleLR": "none", "warmupSteps": 2, "decay": "cosine"},
        "training": {"steps": 12, "logIntervalSteps": 1},
        "checkpoint": {"intervalSteps": 6, "keep": 3},
    }  # fmt: skip
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return spec


def test_tensor_mode_trains_checkpoints_and_matches_one_process(trainer) -> None:  # noqa: ANN001
    tp = trainer.run(gpt_spec(), world=2, job="tp")
    one = trainer.run(gpt_spec(mode="data", parallelism={"tensor": 1}), world=1, job="one")
    s = tp.summary
    assert s["mode"] == "tensor" and s["layout"] == "dp=1,pp=1,tp=2"
    # Same global batches, same initial weights: tensor parallel is the same computation.
    assert abs(s["val_loss"] - one.summary["val_loss"]) < 1e-4 * one.summary["val_loss"]
    assert abs(s["final_loss"] - one.summary["final_loss"]) < 1e-4
    steps = tp.steps_log(0)
    assert all(r["comm_s"] > 0 and r["comm_bytes"] > 0 for r in steps)
    found = sc.list_checkpoints(tp.checkpoint_dir)
    assert [st for st, _ in found] == [6, 12] and all(sc.is_sharded_checkpoint(p) for _, p in found)


def _continue_from(trainer, src, step: int, spec: dict[str, Any], world: int, job: str):  # noqa: ANN001, ANN202
    import shutil  # noqa: PLC0415

    from disttrain_trainer import checkpoint as ckpt  # noqa: PLC0415

    target = trainer.ckpt_root / job
    target.mkdir(parents=True)
    shutil.copytree(src.checkpoint_dir / ckpt.name_for(step), target / ckpt.name_for(step))
    return trainer.run(spec, world=world, job=job)


@pytest.mark.parametrize(
    ("first", "then"),
    [({}, {"mode": "data", "parallelism": {"tensor": 1}}), ({"mode": "data", "parallelism": {"tensor": 1}}, {})],
    ids=["tensor2-to-data2", "data2-to-tensor2"],
)
def test_resume_in_another_layout_equals_uninterrupted(trainer, first: dict, then: dict) -> None:  # noqa: ANN001
    ref = trainer.run(gpt_spec(**first), world=2, job="ref")
    resumed = _continue_from(trainer, ref, 6, gpt_spec(**then), 2, "other")
    assert resumed.summary["resumed_from_step"] == 6
    assert abs(resumed.summary["val_loss"] - ref.summary["val_loss"]) < 1e-4 * ref.summary["val_loss"]


@pytest.mark.parametrize(
    ("over", "world", "layout"),
    [
        ({"mode": "data", "parallelism": {"tensor": 1, "dataStrategy": "fsdp"}}, 2, "dp=2,pp=1,tp=1"),
        ({"mode": "hybrid", "parallelism": {"tensor": 2, "dataStrategy": "fsdp", "sequenceParallel": True}}, 4,
         "dp=2,pp=1,tp=2"),
    ],
    ids=["data-fsdp2", "hybrid-fsdp2xtp2-sp"],
)
def test_mesh_modes_match_one_process(trainer, over: dict, world: int, layout: str) -> None:  # noqa: ANN001
    run = trainer.run(gpt_spec(**over), world=world, job="mesh")
    one = trainer.run(gpt_spec(mode="data", parallelism={"tensor": 1}), world=1, job="one")
    assert run.summary["layout"] == layout
    assert abs(run.summary["val_loss"] - one.summary["val_loss"]) < 1e-4 * one.summary["val_loss"]
