"""The example model package (examples/my_model) trained by real trainer processes, imported from its
source dir as a user image would have it installed: data mode (DDP) exports the final model; a
pipeline run and an FSDP run started from that export with `model.init` begin from exactly those
weights (an optimizer step of lr 1e-30 changes no float32 weight, so each run's export equals the
weights it started from), and each exports what it gathered from its stages or shards."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from disttrain_api import constants as C
from disttrain_api.model import parse_spec
from disttrain_trainer.checkpoints import whole as ckpt
from disttrain_trainer.data import load_dataset
from disttrain_trainer.models import build_model
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


def test_tensor_parallel_run_exports_the_gathered_full_tensors(trainer, make_digits_spec, tmp_path: Path) -> None:  # noqa: ANN001
    spec = make_digits_spec(mode="tensor", parallelism={"tensor": 2}, training={"steps": 2},
                            checkpoint={"intervalSteps": 2})  # fmt: skip
    tp = trainer.run(spec, world=2, job="tp")
    export = tp.summary["export"]["path"]
    # The sharded (DCP) final checkpoint and the export hold the same full tensors: both load
    # strictly into the unsharded model.
    parsed = parse_spec(make_digits_spec())
    ds = load_dataset(parsed, tmp_path)
    from_export = build_model(replace(parsed, model=replace(parsed.model, init=export)), ds).state_dict()
    from_ckpt = build_model(replace(parsed, model=replace(parsed.model, init=str(tp.checkpoint_dir))), ds).state_dict()
    assert_equal(from_export, from_ckpt)
    assert not all(torch.equal(from_export[n], t) for n, t in build_model(parsed, ds).state_dict().items())
