"""Every cross-field rule: a failing manifest and its exact message; several
mistakes are all reported; rules whose inputs failed parsing are skipped."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from disttrain_api.model import SpecError
from disttrain_api.validation import check_job, elastic_sizes, load_job, valid_sizes, validate_spec


def manifest(**spec: Any) -> dict[str, Any]:
    """A valid data-parallel job with `spec` sections deep-merged over it."""
    base: dict[str, Any] = {
        "apiVersion": "disttrain.dev/v1alpha1",
        "kind": "DistTrainJob",
        "metadata": {"name": "job"},
        "spec": {
            "mode": "data",
            "workers": {"replicas": 2, "procsPerWorker": 1},
            "model": {"name": "mlp"},
            "data": {"name": "digits", "batchSize": 256},
        },
    }
    merged = copy.deepcopy(base)
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(merged["spec"].get(key), dict):
            merged["spec"][key].update(value)
        else:
            merged["spec"][key] = value
    return merged


def gpt(**kw: Any) -> dict[str, Any]:
    return {"name": "gpt", "hidden": 128, "heads": 4, **kw}


def errors_of(obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in check_job(obj)[1]]


CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "tensor does not divide the world size",
        manifest(mode="tensor", workers={"replicas": 2, "procsPerWorker": 2}, parallelism={"tensor": 3},
                 model=gpt(hidden=96, heads=3), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.tensor: 3 does not divide the world size 4 (workers.replicas 2 x procsPerWorker 2)"],
    ),
    (
        "pipeline does not divide the world size",
        manifest(mode="pipeline", workers={"replicas": 3}, parallelism={"pipeline": 2},
                 model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.pipeline: 2 does not divide the world size 3 (workers.replicas 3 x procsPerWorker 1)"],
    ),
    (
        "tensor x pipeline does not divide the world size",
        manifest(mode="hybrid", workers={"replicas": 2, "procsPerWorker": 2}, parallelism={"tensor": 2, "pipeline": 4},
                 model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.pipeline: tensor 2 x pipeline 4 = 8 does not divide the world size 4 "
         "(workers.replicas 2 x procsPerWorker 2)"],
    ),
    (
        "data mode with tensor > 1",
        manifest(parallelism={"tensor": 2}),
        ["spec.parallelism.tensor: must be 1 in mode data (got 2); tensor parallelism needs mode tensor or hybrid"],
    ),
    (
        "data mode with pipeline > 1",
        manifest(parallelism={"pipeline": 2}),
        ["spec.parallelism.pipeline: must be 1 in mode data (got 2); pipeline parallelism needs mode pipeline or hybrid"],
    ),
    (
        "federated mode with tensor > 1",
        manifest(mode="federated", parallelism={"tensor": 2}),
        ["spec.parallelism.tensor: must be 1 in mode federated (got 2); tensor parallelism needs mode tensor or hybrid"],
    ),
    (
        "paramserver mode with pipeline > 1",
        manifest(mode="paramserver", parallelism={"pipeline": 2}),
        ["spec.parallelism.pipeline: must be 1 in mode paramserver (got 2); "
         "pipeline parallelism needs mode pipeline or hybrid"],
    ),
    (
        "pipeline mode with one stage",
        manifest(mode="pipeline", model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.pipeline: must be > 1 in mode pipeline (got 1): set the number of stages"],
    ),
    (
        "pipeline mode with tensor > 1",
        manifest(mode="pipeline", workers={"replicas": 4}, parallelism={"pipeline": 2, "tensor": 2},
                 model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.tensor: must be 1 in mode pipeline (got 2); tensor parallelism needs mode tensor or hybrid"],
    ),
    (
        "tensor mode with tensor 1",
        manifest(mode="tensor", model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.tensor: must be > 1 in mode tensor (got 1): set the tensor-parallel degree"],
    ),
    (
        "tensor mode with pipeline > 1",
        manifest(mode="tensor", workers={"replicas": 4}, parallelism={"tensor": 2, "pipeline": 2},
                 model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.pipeline: must be 1 in mode tensor (got 2); pipeline parallelism needs mode pipeline or hybrid"],
    ),
    (
        "hybrid mode with one kind of parallelism",
        manifest(mode="hybrid", parallelism={"tensor": 2}, model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism: mode hybrid needs at least two of the tensor (2), pipeline (1) and data (1) degrees > 1; "
         "for one kind of parallelism use mode tensor, pipeline or data"],
    ),
    (
        "1F1B with fewer micro-batches than stages",
        manifest(mode="pipeline", workers={"replicas": 4}, parallelism={"pipeline": 4, "microbatches": 2},
                 model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.microbatches: schedule 1F1B needs microbatches >= pipeline stages: 2 < 4 "
         "(parallelism.pipeline)"],
    ),
    (
        "Interleaved1F1B with fewer micro-batches than stages",
        manifest(mode="pipeline", workers={"replicas": 4},
                 parallelism={"pipeline": 4, "microbatches": 3, "schedule": "Interleaved1F1B", "virtualStages": 2},
                 model=gpt(), data={"name": "pytext", "batchSize": 63}),
        ["spec.parallelism.microbatches: schedule Interleaved1F1B needs microbatches >= pipeline stages: 3 < 4 "
         "(parallelism.pipeline)"],
    ),
    (
        "an interleaved schedule with one stage per rank",
        manifest(mode="pipeline", parallelism={"pipeline": 2, "microbatches": 4, "schedule": "Interleaved1F1B"},
                 model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.virtualStages: schedule Interleaved1F1B needs >= 2 stages per rank (got 1); "
         "for 1 use schedule 1F1B"],
    ),
    (
        "ZBVZeroBubble with three stages per rank",
        manifest(mode="pipeline", parallelism={"pipeline": 2, "microbatches": 4, "schedule": "ZBVZeroBubble",
                 "virtualStages": 3}, model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.virtualStages: schedule ZBVZeroBubble places exactly 2 stages per rank (got 3)"],
    ),
    (
        "interleaved rounds do not divide the micro-batches",
        manifest(mode="pipeline", parallelism={"pipeline": 2, "microbatches": 5, "schedule": "Interleaved1F1B",
                 "virtualStages": 2}, model=gpt(), data={"name": "pytext", "batchSize": 60}),
        ["spec.parallelism.microbatches: schedule Interleaved1F1B runs rounds of parallelism.pipeline 2 "
         "micro-batches: microbatches 5 must be a multiple of 2"],
    ),
    (
        "virtual stages without an interleaved schedule",
        manifest(mode="pipeline", parallelism={"pipeline": 2, "microbatches": 4, "schedule": "GPipe",
                 "virtualStages": 2}, model=gpt(), data={"name": "pytext", "batchSize": 64}),
        ["spec.parallelism.virtualStages: schedule GPipe runs one stage per rank (got 2); "
         "more need an interleaved schedule"],
    ),
    (
        "batch not divisible by the data degree",
        manifest(workers={"replicas": 3}),
        ["spec.data.batchSize: 256 is not divisible by 3 = data-parallel degree 3 x gradAccumulation 1 "
         "(microbatches count only when parallelism.pipeline > 1); every rank needs an equal share"],
    ),
    (
        "batch not divisible by data degree x gradAccumulation",
        manifest(training={"gradAccumulation": 3}),
        ["spec.data.batchSize: 256 is not divisible by 6 = data-parallel degree 2 x gradAccumulation 3 "
         "(microbatches count only when parallelism.pipeline > 1); every rank needs an equal share"],
    ),
    (
        "batch not divisible by data degree x microbatches x gradAccumulation",
        manifest(mode="pipeline", workers={"replicas": 4}, parallelism={"pipeline": 2, "microbatches": 4},
                 training={"gradAccumulation": 3}, model=gpt(), data={"name": "pytext", "batchSize": 60}),
        ["spec.data.batchSize: 60 is not divisible by 24 = data-parallel degree 2 x microbatches 4 x "
         "gradAccumulation 3; every rank needs an equal share"],
    ),
    (
        "federated block outside federated mode",
        manifest(federated={"clients": 10}),
        ["spec.federated: only allowed in mode federated (mode is data); remove it or set spec.mode: federated"],
    ),
    (
        "paramServer block outside paramserver mode",
        manifest(paramServer={"maxStaleness": 2}),
        ["spec.paramServer: only allowed in mode paramserver (mode is data); remove it or set spec.mode: paramserver"],
    ),
    (
        "more clients per round than clients",
        manifest(mode="federated", federated={"clients": 4, "clientsPerRound": 8}),
        ["spec.federated.clientsPerRound: 8 must be <= federated.clients 4"],
    ),
    (
        "elastic minReplicas above replicas",
        manifest(elastic={"minReplicas": 3, "maxReplicas": 4}),
        ["spec.elastic.minReplicas: 3 must be <= workers.replicas 2"],
    ),
    (
        "elastic maxReplicas below replicas",
        manifest(workers={"replicas": 4}, elastic={"minReplicas": 1, "maxReplicas": 2}),
        ["spec.elastic.maxReplicas: 2 must be >= workers.replicas 4"],
    ),
    (
        "elastic range with a size the batch does not split over",
        manifest(elastic={"minReplicas": 1, "maxReplicas": 4}),
        ["spec.elastic: the range [1, 4] contains sizes that break the spec: 3 (at 3: spec.data.batchSize: 256 is "
         "not divisible by 3 = data-parallel degree 3 x gradAccumulation 1 (microbatches count only when "
         "parallelism.pipeline > 1); every rank needs an equal share); valid: 1-2, 4; set minReplicas and "
         "maxReplicas so that every size between them is valid, or change the fields named"],
    ),
    (
        "elastic range below the tensor-parallel degree",
        manifest(mode="tensor", parallelism={"tensor": 2}, model=gpt(), data={"name": "pytext", "batchSize": 64},
                 elastic={"minReplicas": 1, "maxReplicas": 2}),
        ["spec.elastic: the range [1, 2] contains sizes that break the spec: 1 (at 1: spec.parallelism.tensor: 2 "
         "does not divide the world size 1 (workers.replicas 1 x procsPerWorker 1)); valid: 2; set minReplicas and "
         "maxReplicas so that every size between them is valid, or change the fields named"],
    ),
    (
        "elastic range where hybrid loses its second degree",
        manifest(mode="hybrid", workers={"replicas": 4}, parallelism={"tensor": 2}, model=gpt(),
                 data={"name": "pytext", "batchSize": 64}, elastic={"minReplicas": 2, "maxReplicas": 4}),
        ["spec.elastic: the range [2, 4] contains sizes that break the spec: 2-3 (at 2: spec.parallelism: mode "
         "hybrid needs at least two of the tensor (2), pipeline (1) and data (1) degrees > 1; for one kind of "
         "parallelism use mode tensor, pipeline or data; at 3: spec.parallelism.tensor: 2 does not divide the world "
         "size 3 (workers.replicas 3 x procsPerWorker 1)); valid: 4; set minReplicas and maxReplicas so that every "
         "size between them is valid, or change the fields named"],
    ),
    (
        "elastic range counts processes per pod and gradient accumulation",
        manifest(workers={"replicas": 2, "procsPerWorker": 2}, data={"batchSize": 48},
                 training={"gradAccumulation": 2}, elastic={"minReplicas": 1, "maxReplicas": 8}),
        ["spec.elastic: the range [1, 8] contains sizes that break the spec: 5, 7-8 (at 5: spec.data.batchSize: 48 "
         "is not divisible by 20 = data-parallel degree 10 x gradAccumulation 2 (microbatches count only when "
         "parallelism.pipeline > 1); every rank needs an equal share; at 7: spec.data.batchSize: 48 is not divisible "
         "by 28 = data-parallel degree 14 x gradAccumulation 2 (microbatches count only when parallelism.pipeline "
         "> 1); every rank needs an equal share; and 1 more); valid: 1-4, 6; set minReplicas and maxReplicas so "
         "that every size between them is valid, or change the fields named"],
    ),
    (
        "negative gpus",
        manifest(workers={"resources": {"gpus": -1}}),
        ["spec.workers.resources.gpus: -1 must be >= 0"],
    ),
    (
        "fractional gpus",
        manifest(workers={"resources": {"gpus": 1.5}}),
        ["spec.workers.resources.gpus: expected an integer, got a number 1.5"],
    ),
    (
        "gpus as a string",
        manifest(workers={"resources": {"gpus": "2"}}),
        ["spec.workers.resources.gpus: expected an integer, got a string '2'"],
    ),
    (
        "fp16 without GPUs",
        manifest(training={"precision": "fp16"}),
        ["spec.training.precision: fp16 needs GPUs (workers.resources.gpus is 0); use bf16 or fp32 on CPU"],
    ),
    (
        "more processes than GPUs",
        manifest(workers={"replicas": 1, "procsPerWorker": 4, "resources": {"gpus": 2}}),
        ["spec.workers.procsPerWorker: 4 processes per pod cannot each have a GPU: workers.resources.gpus is 2"],
    ),
    (
        "GPUs for a mode whose workers train on CPU",
        manifest(mode="paramserver", workers={"resources": {"gpus": 1}}),
        ["spec.workers.resources.gpus: mode paramserver trains on CPU (its workers exchange parameters over "
         "gRPC); set workers.resources.gpus to 0"],
    ),
    (
        "gpt hidden not divisible by heads",
        manifest(model=gpt(hidden=100, heads=3), data={"name": "pytext", "batchSize": 64}),
        ["spec.model.hidden: 100 is not divisible by model.heads 3"],
    ),
    (
        "gpt heads not divisible by the tensor degree",
        manifest(mode="tensor", workers={"replicas": 4}, parallelism={"tensor": 4},
                 model=gpt(hidden=96, heads=6), data={"name": "pytext", "batchSize": 64}),
        ["spec.model.heads: 6 is not divisible by parallelism.tensor 4"],
    ),
    (
        "gpt hidden not divisible by the tensor degree",
        # (heads | hidden and tensor | heads imply tensor | hidden: it fails only with the first rule)
        manifest(mode="tensor", workers={"replicas": 4}, parallelism={"tensor": 4},
                 model=gpt(hidden=6, heads=4), data={"name": "pytext", "batchSize": 64}),
        ["spec.model.hidden: 6 is not divisible by model.heads 4",
         "spec.model.hidden: 6 is not divisible by parallelism.tensor 4"],
    ),
    (
        "gpt on digits",
        manifest(model=gpt()),
        ["spec.data.name: digits does not fit model gpt (a language model); use pytext or synthetic"],
    ),
    (
        "mlp on text",
        manifest(data={"name": "pytext"}),
        ["spec.data.name: pytext does not fit model mlp (an image classifier); use digits or synthetic"],
    ),
    (
        "cnn on text",
        manifest(model={"name": "cnn"}, data={"name": "pytext"}),
        ["spec.data.name: pytext does not fit model cnn (an image classifier); use digits or synthetic"],
    ),
]


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_message(obj: dict[str, Any], expected: list[str]) -> None:
    assert errors_of(obj) == expected
    with pytest.raises(SpecError) as info:
        load_job(obj)
    assert [str(e) for e in info.value.errors] == expected
    assert str(info.value) == "\n".join(expected)


VALID: list[tuple[str, dict[str, Any]]] = [
    ("defaults", manifest()),
    ("microbatches do not count without a pipeline", manifest(parallelism={"microbatches": 3})),
    ("GPipe may have fewer micro-batches than stages",
     manifest(mode="pipeline", workers={"replicas": 4}, parallelism={"pipeline": 4, "microbatches": 2,
              "schedule": "GPipe"}, model=gpt(), data={"name": "pytext", "batchSize": 64})),
    ("Interleaved1F1B with two stages per rank",
     manifest(mode="pipeline", parallelism={"pipeline": 2, "microbatches": 4, "schedule": "Interleaved1F1B",
              "virtualStages": 2}, model=gpt(), data={"name": "pytext", "batchSize": 64})),
    ("Naive ignores micro-batches", manifest(mode="pipeline", parallelism={"pipeline": 2, "microbatches": 1,
                                                                          "schedule": "Naive"})),
    ("federated batch is a local batch", manifest(mode="federated", workers={"replicas": 3})),
    ("hybrid with tensor and data", manifest(mode="hybrid", workers={"replicas": 4}, parallelism={"tensor": 2},
                                              model=gpt(), data={"name": "pytext", "batchSize": 64})),
    ("bf16 on CPU", manifest(training={"precision": "bf16"})),
    ("fp16 on GPUs", manifest(workers={"procsPerWorker": 2, "resources": {"gpus": 2}}, training={"precision": "fp16"})),
    ("elastic bounds inclusive", manifest(elastic={"minReplicas": 2, "maxReplicas": 2})),
    ("every elastic size splits the batch", manifest(data={"batchSize": 240}, elastic={"minReplicas": 1,
                                                                                     "maxReplicas": 4})),
    ("synthetic data fits every model", manifest(model=gpt(), data={"name": "synthetic"})),
    ("custom models take any data", manifest(model={"name": "mypkg.models:build"}, data={"name": "pytext"})),
]


@pytest.mark.parametrize("obj", [v[1] for v in VALID], ids=[v[0] for v in VALID])
def test_valid(obj: dict[str, Any]) -> None:
    assert errors_of(obj) == []
    job = load_job(obj)
    assert validate_spec(job.spec) == []


def test_several_mistakes_are_all_reported() -> None:
    obj = manifest(
        workers={"replicas": 2, "procsPerWorker": 2, "resources": {"gpus": 0.5}},
        parallelism={"tensor": 3},
        model=gpt(hidden=100, heads=3),
        training={"precision": "fp16", "stepz": 5},
        federated={"clients": 4, "clientsPerRound": 8},
        elastic={"minReplicas": 3, "maxReplicas": 1},
    )
    obj["metadata"]["name"] = "Bad_Job"
    assert errors_of(obj) == [
        "metadata.name: 'Bad_Job' must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter and "
        "ending with a letter or digit) of at most 45 characters: it names the job's Service and pods",
        "spec.workers.resources.gpus: expected an integer, got a number 0.5",
        "spec.training.stepz: unknown field (known fields: activationCheckpointing, bucketCapMB, compile, "
        "evalIntervalSteps, float8, gradAccumulation, gradientCompression, logIntervalSteps, loss, powerSGDRank, "
        "precision, steps, sync)",
        "spec.parallelism.tensor: 3 does not divide the world size 4 (workers.replicas 2 x procsPerWorker 2)",
        "spec.parallelism.tensor: must be 1 in mode data (got 3); tensor parallelism needs mode tensor or hybrid",
        "spec.federated: only allowed in mode federated (mode is data); remove it or set spec.mode: federated",
        "spec.federated.clientsPerRound: 8 must be <= federated.clients 4",
        "spec.elastic.minReplicas: 3 must be <= workers.replicas 2",
        "spec.elastic.maxReplicas: 1 must be >= workers.replicas 2",
        "spec.data.name: digits does not fit model gpt (a language model); use pytext or synthetic",
        "spec.model.hidden: 100 is not divisible by model.heads 3",
        "spec.model.hidden: 100 is not divisible by parallelism.tensor 3",
    ]


def test_rules_on_bad_inputs_are_skipped_but_others_still_run() -> None:
    # replicas is not an integer: the degree and batch rules would only see the
    # default that replaced it, so they stay silent; the model rule still runs.
    obj = manifest(workers={"replicas": "two"}, parallelism={"tensor": 3}, model=gpt(hidden=100, heads=3),
                   data={"name": "pytext"})
    assert errors_of(obj) == [
        "spec.workers.replicas: expected an integer, got a string 'two'",
        "spec.parallelism.tensor: must be 1 in mode data (got 3); tensor parallelism needs mode tensor or hybrid",
        "spec.model.hidden: 100 is not divisible by model.heads 3",
        "spec.model.hidden: 100 is not divisible by parallelism.tensor 3",
    ]


def test_a_spec_that_is_not_an_object_reports_once() -> None:
    obj = manifest()
    obj["spec"] = ["mode", "data"]
    assert errors_of(obj) == ["spec: expected an object, got a list"]


def test_bad_mode_skips_mode_rules() -> None:
    assert errors_of(manifest(mode="dataparallel", parallelism={"tensor": 2})) == [
        "spec.mode: 'dataparallel' is not one of data, pipeline, tensor, hybrid, federated, paramserver",
    ]


def test_valid_sizes_are_the_sizes_where_every_rule_holds() -> None:
    job, _ = check_job(manifest(workers={"replicas": 8}, data={"batchSize": 64},
                                elastic={"minReplicas": 1, "maxReplicas": 16}))
    assert valid_sizes(job.spec) == [1, 2, 4, 8, 16]
    sizes = elastic_sizes(job.spec)
    assert sorted(sizes) == list(range(1, 17)) and sizes[8] == [] and sizes[3][0].path == "spec.data.batchSize"
    # without spec.elastic: only its own size
    assert valid_sizes(load_job(manifest()).spec) == [2]


def test_elastic_sizes_are_not_checked_while_the_spec_is_invalid_at_its_own_size() -> None:
    assert errors_of(manifest(data={"batchSize": 255}, elastic={"minReplicas": 1, "maxReplicas": 4})) == [
        "spec.data.batchSize: 255 is not divisible by 2 = data-parallel degree 2 x gradAccumulation 1 "
        "(microbatches count only when parallelism.pipeline > 1); every rank needs an equal share",
    ]
