"""mode tensor / hybrid and data with FSDP through `python -m disttrain_trainer` (real gloo processes).

The same small GPT and global batches in every run: tensor parallel, FSDP and
DP x TP are the same computation as one process, so validation losses agree to
1e-4 (relative); a checkpoint written in one layout resumes in another and
continues as the writer did.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from disttrain_trainer.checkpoints import sharded as sc
from disttrain_trainer.checkpoints import whole as ckpt

REL = 1e-4
DATA = {"mode": "data", "parallelism": {"tensor": 1}}


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


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * abs(b)


@pytest.fixture(scope="module")
def one(module_trainer):  # noqa: ANN001, ANN201
    return module_trainer.run(gpt_spec(**DATA), world=1, job="one")


@pytest.fixture(scope="module")
def tensor2(module_trainer):  # noqa: ANN001, ANN201
    return module_trainer.run(gpt_spec(), world=2, job="tensor2")


@pytest.fixture(scope="module")
def data2(module_trainer):  # noqa: ANN001, ANN201
    return module_trainer.run(gpt_spec(**DATA), world=2, job="data2")


def test_tensor_mode_matches_one_process_with_measured_comm_and_sharded_checkpoints(tensor2, one) -> None:  # noqa: ANN001
    s = tensor2.summary
    assert s["mode"] == "tensor" and s["layout"] == "dp=1,pp=1,tp=2"
    assert close(s["valLoss"], one.summary["valLoss"]) and abs(s["finalLoss"] - one.summary["finalLoss"]) < 1e-4
    assert all(r["comm_busy_s"] > 0 and r["comm_bytes"] > 0 for r in tensor2.steps_log(0))
    # one sample = one window of blockSize tokens; no MFU on a CPU (no known peak)
    assert s["tokensPerS"] == pytest.approx(s["samplesPerS"] * 16) and "mfu" not in s
    found = sc.list_checkpoints(tensor2.checkpoint_dir)
    assert [st for st, _ in found] == [6, 12] and all(sc.is_sharded_checkpoint(p) for _, p in found)


def _continue(trainer, src, spec: dict[str, Any], job: str):  # noqa: ANN001, ANN202
    target = trainer.ckpt_root / job
    target.mkdir(parents=True)
    shutil.copytree(src.checkpoint_dir / ckpt.name_for(6), target / ckpt.name_for(6))
    run = trainer.run(spec, world=2, job=job)
    assert run.summary["resumedFromStep"] == 6
    return run


def test_tensor2_checkpoint_resumes_in_data2(module_trainer, tensor2) -> None:  # noqa: ANN001
    resumed = _continue(module_trainer, tensor2, gpt_spec(**DATA), "tensor2-to-data2")
    assert close(resumed.summary["valLoss"], tensor2.summary["valLoss"])


def test_data2_checkpoint_resumes_in_tensor2(module_trainer, data2) -> None:  # noqa: ANN001
    assert (data2.checkpoint_dir / ckpt.name_for(6) / ckpt.STATE_FILE).is_file()  # checkpoint.py's format
    resumed = _continue(module_trainer, data2, gpt_spec(), "data2-to-tensor2")
    assert close(resumed.summary["valLoss"], data2.summary["valLoss"])


@pytest.mark.parametrize(
    ("over", "world", "layout"),
    [
        ({"mode": "data", "parallelism": {"tensor": 1, "dataStrategy": "fsdp"}}, 2, "dp=2,pp=1,tp=1"),
        ({"mode": "hybrid", "parallelism": {"tensor": 2, "dataStrategy": "fsdp", "sequenceParallel": True}}, 4,
         "dp=2,pp=1,tp=2"),
    ],
    ids=["data-fsdp2", "hybrid-fsdp2xtp2-sp"],
)
def test_mesh_modes_match_one_process(module_trainer, one, over: dict, world: int, layout: str) -> None:  # noqa: ANN001
    run = module_trainer.run(gpt_spec(**over, workers={"replicas": world}), world=world, job=layout)
    assert run.summary["layout"] == layout
    assert close(run.summary["valLoss"], one.summary["valLoss"])
