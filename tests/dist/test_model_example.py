"""The example model package (examples/my_model) trained by real trainer processes, imported from its
source dir as a user image would have it installed: data mode (DDP) exports the final model; a
pipeline run and an FSDP run started from that export with `model.init` begin from exactly those
weights (an optimizer step of lr 1e-30 changes no float32 weight, so each run's export equals the
weights it started from), and each exports what it gathered from its stages or shards."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from disttrain_api import constants as C
from disttrain_trainer.checkpoints import whole as ckpt
from safetensors.torch import load_file

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_model"
FACTORY = "my_model.model:factory"
NO_CHANGE_LR = 1e-30  # lr x gradient is far below half an ulp of every weight


def example_env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")])}


def exported(summary: dict[str, Any]) -> dict[str, torch.Tensor]:
    export = Path(summary["export"]["path"])
    assert export.name == C.EXPORT_DIRNAME
    return load_file(str(export / summary["export"]["weights"]))


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_example_model_exports_and_other_modes_start_from_the_export(trainer, make_digits_spec) -> None:  # noqa: ANN001
    base = make_digits_spec(model={"name": FACTORY, "hidden": 16, "layers": 3},
                            training={"steps": 4, "logIntervalSteps": 2}, checkpoint={"intervalSteps": 4})  # fmt: skip
    ddp = trainer.run(base, world=2, job="ddp", env=example_env())
    weights = exported(ddp.summary)
    loaded = ckpt.load_latest(ddp.checkpoint_dir)
    assert loaded is not None and loaded[0] == 4 and ddp.summary["export"]["step"] == 4
    assert_equal(weights, loaded[1]["model"])  # the export is the final model

    fresh = make_digits_spec(
        model={"name": FACTORY, "hidden": 16, "layers": 3, "init": ddp.summary["export"]["path"]},
        optimizer={"name": "sgd", "lr": NO_CHANGE_LR, "baseBatchSize": 64, "warmupSteps": 0},
        training={"steps": 1}, checkpoint={"intervalSteps": 1},
    )  # fmt: skip
    pipe_spec = dict(fresh, mode="pipeline", parallelism={"pipeline": 2, "microbatches": 2, "partition": "uniform"})
    pipe = trainer.run(pipe_spec, world=2, job="pipe", env=example_env())
    assert_equal(exported(pipe.summary), weights)

    fsdp_spec = dict(fresh, model={**fresh["model"], "init": pipe.summary["export"]["path"]},
                     parallelism={"dataStrategy": "fsdp"})  # fmt: skip
    fsdp = trainer.run(fsdp_spec, world=2, job="fsdp", env=example_env())
    assert_equal(exported(fsdp.summary), weights)
