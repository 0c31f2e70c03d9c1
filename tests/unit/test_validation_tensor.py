"""Rules of the tensor/hybrid fields: dataStrategy, sequenceParallel, degrees against the mesh."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from disttrain_api.model import parse_spec
from disttrain_api.validation import check_job
from disttrain_trainer.parallel.mesh import layout_for
from disttrain_trainer.process.config import ConfigError

BASE: dict[str, Any] = {
    "apiVersion": "disttrain.dev/v1alpha1",
    "kind": "DistTrainJob",
    "metadata": {"name": "job"},
    "spec": {
        "mode": "tensor",
        "workers": {"replicas": 1, "procsPerWorker": 2},
        "parallelism": {"tensor": 2},
        "model": {"name": "gpt", "hidden": 128, "heads": 4, "blockSize": 64},
        "data": {"name": "pytext", "batchSize": 32},
    },
}


def job(**sections: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    for key, value in sections.items():
        obj["spec"][key] = {**obj["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return obj


def errors(obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in check_job(obj)[1]]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (job(model={"heads": 6, "hidden": 96}, parallelism={"tensor": 4}, workers={"procsPerWorker": 4}),
         ["spec.model.heads: 6 is not divisible by parallelism.tensor 4"]),
        (job(parallelism={"tensor": 4}),
         ["spec.parallelism.tensor: 4 does not divide the world size 2 (workers.replicas 1 x procsPerWorker 2)"]),
        (job(parallelism={"dataStrategy": "fsdp"}),
         ["spec.parallelism.dataStrategy: fsdp shards over the data dimension; mode tensor has none "
          "(use mode data or hybrid)"]),
        (job(mode="data", parallelism={"tensor": 1, "sequenceParallel": True}),
         ["spec.parallelism.sequenceParallel: needs parallelism.tensor > 1 (it splits the tensor-parallel "
          "regions' sequence)"]),
        (job(parallelism={"sequenceParallel": True}, model={"blockSize": 63}),
         ["spec.parallelism.sequenceParallel: model.blockSize 63 is not divisible by parallelism.tensor 2"]),
    ],
    ids=["heads", "world", "fsdp-in-tensor", "sp-without-tensor", "sp-block-size"],
)
def test_bad_degrees_name_the_fields(obj: dict[str, Any], expected: list[str]) -> None:
    assert errors(obj) == expected


def test_hybrid_pipeline_x_tensor_is_valid() -> None:
    pp_x_tp = job(mode="hybrid", workers={"replicas": 2, "procsPerWorker": 2}, parallelism={"pipeline": 2})
    assert errors(pp_x_tp) == []
    dp_x_pp_x_tp = job(mode="hybrid", workers={"replicas": 4, "procsPerWorker": 2}, parallelism={"pipeline": 2})
    assert errors(dp_x_pp_x_tp) == []
    lay = layout_for(parse_spec(dp_x_pp_x_tp["spec"]), 8)
    assert (lay.dp, lay.pp, lay.tp) == (2, 2, 2)


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"model": {"heads": 6, "hidden": 96}, "parallelism": {"tensor": 4, "pipeline": 2},
          "workers": {"replicas": 2, "procsPerWorker": 4}},
         ["spec.model.heads: 6 is not divisible by parallelism.tensor 4"]),
        ({"parallelism": {"pipeline": 4}, "workers": {"replicas": 3, "procsPerWorker": 2}},
         ["spec.parallelism.pipeline: 4 does not divide the world size 6 (workers.replicas 3 x procsPerWorker 2)"]),
        ({"parallelism": {"pipeline": 2, "schedule": "PipeDream"}, "workers": {"replicas": 2, "procsPerWorker": 2}},
         ["spec.parallelism.schedule: PipeDream runs with parallelism.tensor 1 (got 2); use a synchronous schedule "
          "with tensor parallelism"]),
    ],
    ids=["heads", "world", "pipedream"],
)
def test_hybrid_pipeline_x_tensor_bad_degrees_name_the_fields(sections: dict[str, Any], expected: list[str]) -> None:
    assert errors(job(mode="hybrid", **sections)) == expected


def test_fsdp_with_a_pipeline_is_refused() -> None:
    obj = job(mode="hybrid", workers={"replicas": 4, "procsPerWorker": 1},
              parallelism={"tensor": 1, "pipeline": 2, "dataStrategy": "fsdp"})  # fmt: skip
    assert errors(obj) == [
        "spec.parallelism.dataStrategy: fsdp is not supported with parallelism.pipeline 2 (stages keep whole "
        "replicas); use ddp, or pipeline 1"
    ]


def test_valid_layouts() -> None:
    assert errors(job(parallelism={"sequenceParallel": True})) == []
    assert errors(job(mode="data", parallelism={"tensor": 1, "dataStrategy": "fsdp"})) == []
    hybrid = job(mode="hybrid", workers={"replicas": 2}, parallelism={"dataStrategy": "fsdp", "sequenceParallel": True})
    assert errors(hybrid) == []
    data_x_pipeline = job(mode="hybrid", workers={"replicas": 4, "procsPerWorker": 1},
                          parallelism={"tensor": 1, "pipeline": 2})  # fmt: skip
    assert errors(data_x_pipeline) == []


def test_trainer_world_size_must_fit_the_mesh() -> None:
    spec = parse_spec(job(mode="hybrid", workers={"replicas": 2})["spec"])
    lay = layout_for(spec, 4)
    assert (lay.dp, lay.pp, lay.tp) == (2, 1, 2)
    with pytest.raises(ConfigError, match=r"world size 3 is not divisible by parallelism.tensor 2"):
        layout_for(spec, 3)
