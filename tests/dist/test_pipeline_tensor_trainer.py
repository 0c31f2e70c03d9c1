"""`mode: hybrid` with pipeline x tensor through `python -m disttrain_trainer` on real gloo processes.

A small GPT in two stages, each sharded over two tensor-parallel ranks (world 4),
trains like one process on the same global batches; its checkpoint holds full
tensors keyed by global block index, whatever the tensor degree, and resumes.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel.blocks import block_state, split_blocks

REL = 1e-4
MODEL = {"name": "gpt", "hidden": 32, "layers": 2, "heads": 4, "blockSize": 16, "dropout": 0.0}


def gpt_spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": "hybrid",
        "workers": {"replicas": 2, "procsPerWorker": 2},
        "parallelism": {"tensor": 2, "pipeline": 2, "microbatches": 2, "schedule": "1F1B"},
        "model": MODEL,
        "data": {"name": "pytext", "batchSize": 8, "seed": 1, "shards": 2},
        "optimizer": {"name": "adamw", "lr": 0.003, "scaleLR": "none", "warmupSteps": 2, "decay": "cosine"},
        "training": {"steps": 6, "logIntervalSteps": 1},
        "checkpoint": {"intervalSteps": 3, "keep": 3},
    }  # fmt: skip
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return spec


def blocks_of(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    loaded = ckpt.load_latest(result.checkpoint_dir)
    assert loaded is not None
    state = loaded[1]
    if "blocks" in state:
        return state["blocks"]
    vocab = state["model"]["tok.weight"].shape[0]
    model = GPT(vocab, MODEL["blockSize"], MODEL["hidden"], MODEL["layers"], MODEL["heads"], 0.0, "none")
    model.load_state_dict(state["model"])
    blocks = split_blocks(model)
    return block_state(blocks, range(len(blocks)))


@pytest.fixture(scope="module")
def one(module_trainer):  # noqa: ANN001, ANN201
    spec = gpt_spec(mode="data", workers={"replicas": 1, "procsPerWorker": 1}, parallelism={"tensor": 1, "pipeline": 1})
    return module_trainer.run(spec, world=1, job="one")


@pytest.fixture(scope="module")
def pp2tp2(module_trainer):  # noqa: ANN001, ANN201
    return module_trainer.run(gpt_spec(), world=4, job="pp2tp2", timeout=600)


def test_pipeline_x_tensor_trains_like_one_process(pp2tp2, one) -> None:  # noqa: ANN001
    s = pp2tp2.summary
    assert s["mode"] == "hybrid" and s["steps"] == 6 and s["layout"] == "dp=1,pp=2,tp=2"
    assert s["pipeline"]["stages"] == 2 and s["pipeline"]["tensorDegree"] == 2
    assert [st["stage"] for st in s["pipeline"]["perStage"]] == [0, 1]
    assert abs(s["valLoss"] - one.summary["valLoss"]) <= REL * one.summary["valLoss"]
    ref, got = blocks_of(one), blocks_of(pp2tp2)
    assert got.keys() == ref.keys()
    for k in ref:  # full tensors, not shards
        torch.testing.assert_close(got[k], ref[k], atol=1e-4, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize(
    ("over", "world"),
    [({}, 4), ({"mode": "pipeline", "workers": {"replicas": 2, "procsPerWorker": 1}, "parallelism": {"tensor": 1}}, 2)],
    ids=["pp2xtp2", "pp2"],
)
def test_pipeline_x_tensor_checkpoint_resumes(module_trainer, pp2tp2, over: dict[str, Any], world: int) -> None:  # noqa: ANN001
    """Step 3's checkpoint continues to the uninterrupted run's result, also with another tensor degree."""
    job = f"resume-{world}"
    target = module_trainer.ckpt_root / job
    target.mkdir(parents=True)
    shutil.copytree(pp2tp2.checkpoint_dir / ckpt.name_for(3), target / ckpt.name_for(3))
    resumed = module_trainer.run(gpt_spec(**over), world=world, job=job, timeout=600)
    assert resumed.summary["resumedFromStep"] == 3
    assert abs(resumed.summary["valLoss"] - pp2tp2.summary["valLoss"]) <= REL * pp2tp2.summary["valLoss"]
    ref, got = blocks_of(pp2tp2), blocks_of(resumed)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=1e-4, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
