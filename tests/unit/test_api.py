"""The typed model: defaults, schema-level errors, JSON round trip, status."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from disttrain_api import model as api
from disttrain_api.model import (
    JobSpec,
    JobStatus,
    SpecError,
    parse_job,
    parse_job_partial,
    parse_spec,
    parse_status,
    to_json,
)


def job(spec: Any = None, **top: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "j"}}
    if spec is not None:
        obj["spec"] = spec
    obj.update(top)
    return obj


def schema_errors(obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in parse_job_partial(obj)[1]]


def test_empty_spec_is_all_defaults() -> None:
    parsed = parse_job(job())
    assert parsed.spec == JobSpec()
    assert parsed.metadata.namespace == "default"
    s = parsed.spec
    assert (s.mode, s.workers.replicas, s.workers.procs_per_worker, s.world_size, s.data_degree) == ("data", 2, 1, 2, 2)
    assert s.metrics.port == 9400 and s.checkpoint.path == "/checkpoints" and s.elastic is None


def test_to_json_uses_api_names_and_round_trips() -> None:
    spec = parse_spec(
        {
            "mode": "federated",
            "workers": {"procsPerWorker": 2, "resources": {"cpu": 2, "memory": "1Gi"}},
            "optimizer": {"scaleLR": "sqrt", "minLRRatio": 0.1},
            "training": {"powerSGDRank": 4, "bucketCapMB": 10},
            "elastic": {"minReplicas": 1, "maxReplicas": 3},
        }
    )
    doc = to_json(spec)
    assert doc["workers"]["procsPerWorker"] == 2
    assert doc["workers"]["resources"]["cpu"] == "2"  # quantities are strings on the way out
    assert doc["optimizer"]["scaleLR"] == "sqrt" and doc["optimizer"]["minLRRatio"] == 0.1
    assert doc["training"]["powerSGDRank"] == 4 and doc["training"]["bucketCapMB"] == 10.0
    assert doc["paramServer"] is None and doc["runPolicy"]["cleanPodPolicy"] == "Running"
    # The trainer reads exactly this JSON back.
    assert parse_spec(json.loads(json.dumps(doc))) == spec


def test_mode_block_is_filled_in_its_mode() -> None:
    assert parse_spec({"mode": "federated"}).federated == api.FederatedSpec()
    assert parse_spec({"mode": "paramserver"}).param_server == api.ParamServerSpec()
    assert parse_spec({"mode": "data"}).federated is None


def test_explicit_null_means_default() -> None:
    spec = parse_spec({"workers": None, "data": {"batchSize": None}, "elastic": None})
    assert spec.workers == api.Workers() and spec.data.batch_size == 256 and spec.elastic is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"mode": "ddp"}, "spec.mode: 'ddp' is not one of data, pipeline, tensor, hybrid, federated, paramserver"),
        ({"workers": {"replicas": 0}}, "spec.workers.replicas: 0 must be >= 1"),
        ({"workers": {"replicas": 2000}}, "spec.workers.replicas: 2000 must be <= 1024"),
        ({"workers": {"replicas": True}}, "spec.workers.replicas: expected an integer, got a boolean True"),
        ({"workers": "big"}, "spec.workers: expected an object, got a string"),
        ({"workers": {"template": []}}, "spec.workers.template: expected an object, got a list"),
        ({"workers": {"resources": {"memory": "2GB"}}},
         "spec.workers.resources.memory: '2GB' is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)"),
        ({"workers": {"resources": {"cpu": 0.5}}},
         "spec.workers.resources.cpu: expected a quantity such as 2, '500m' or '4Gi', got a number; quote it: '0.5'"),
        ({"optimizer": {"lr": 0}}, "spec.optimizer.lr: 0.0 must be greater than 0"),
        ({"optimizer": {"lr": "fast"}}, "spec.optimizer.lr: expected a number, got a string 'fast'"),
        ({"optimizer": {"momentum": 1.5}}, "spec.optimizer.momentum: 1.5 must be <= 1"),
        ({"model": {"name": "resnet"}},
         "spec.model.name: 'resnet' does not match " + api.MODEL_NAME_PATTERN),
        ({"training": {"activationCheckpointing": "every:0"}},
         "spec.training.activationCheckpointing: 'every:0' does not match " + api.ACT_CKPT_PATTERN),
        ({"runPolicy": {"suspend": "yes"}}, "spec.runPolicy.suspend: expected a boolean (true or false), got a string"),
        ({"checkpoint": {"path": "ckpt"}}, "spec.checkpoint.path: 'ckpt' does not match ^/.*"),
        ({"metrics": {"port": 80}}, "spec.metrics.port: 80 must be >= 1024"),
        ({"federated": {"partition": {"alpha": 0}}}, "spec.federated.partition.alpha: 0.0 must be greater than 0"),
        ({"replicas": 2}, "spec.replicas: unknown field (known fields: checkpoint, data, elastic, faultTolerance, federated, "
                          "image, metrics, mode, model, objectStore, optimizer, parallelism, paramServer, runPolicy, tracking, "
                          "training, workers)"),
    ],
)
def test_schema_error_messages(spec: dict[str, Any], expected: str) -> None:
    assert schema_errors(job(spec)) == [expected]
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert [str(e) for e in info.value.errors] == [expected]


def test_quantities_accept_integers_and_strings() -> None:
    res = parse_spec({"workers": {"resources": {"cpu": 2, "memory": "512Mi"}}}).workers.resources
    assert (res.cpu, res.memory) == ("2", "512Mi") and isinstance(res.cpu, api.Quantity)


def test_top_level_errors() -> None:
    obj = {"apiVersion": "v1", "kind": "Job", "metadata": {"name": "x" * 46}, "spec": {}, "spce": {}}
    assert schema_errors(obj) == [
        "spce: unknown field (known fields: apiVersion, kind, metadata, spec, status)",
        "apiVersion: 'v1' must be disttrain.dev/v1alpha1",
        "kind: 'Job' must be DistTrainJob",
        f"metadata.name: '{'x' * 46}' must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter and "
        "ending with a letter or digit) of at most 45 characters: it names the job's Service and pods",
    ]
    assert schema_errors(job(metadata={})) == ["metadata.name: required field is missing"]
    assert schema_errors(job(metadata="j")) == ["metadata: expected an object, got a string"]
    assert schema_errors([1]) == ["(document): expected a DistTrainJob object, got a list"]  # type: ignore[arg-type]


def test_partial_parse_replaces_bad_values_with_defaults() -> None:
    parsed, errors = parse_job_partial(job({"workers": {"replicas": -3, "procsPerWorker": 4}, "mode": "x"}))
    assert [e.path for e in errors] == ["spec.mode", "spec.workers.replicas"]
    assert parsed.spec.workers.replicas == 2 and parsed.spec.workers.procs_per_worker == 4
    assert parsed.spec.mode == "data"


def test_every_spec_field_has_a_default() -> None:
    def walk(cls: Any) -> None:
        for f in dataclasses.fields(cls):
            assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name
            if dataclasses.is_dataclass(f.type) or (isinstance(f.type, str) and hasattr(api, f.type)):
                target = getattr(api, f.type) if isinstance(f.type, str) else f.type
                if dataclasses.is_dataclass(target):
                    walk(target)

    walk(JobSpec)


def test_status_parses_what_the_operator_writes() -> None:
    status = parse_status(
        {
            "phase": "Running",
            "conditions": [
                {"type": "Running", "status": "True", "reason": "GangRunning", "message": "2/2 workers running",
                 "lastTransitionTime": "2024-01-02T03:04:05Z"}
            ],
            "workers": {"active": 2},
            "replicas": 2,
            "restarts": 1,
            "step": 120,
            "lastCheckpointStep": 100,
            "startTime": "2024-01-02T03:04:00Z",
            "observedGeneration": 3,
            "result": {"testAccuracy": 0.97},
            "kopf": {"progress": {"create": {"started": "x"}}},
            "create_fn": {"some": "handler result kopf keeps here"},
        }
    )
    assert status.phase == "Running" and status.conditions[0].reason == "GangRunning"
    assert status.workers == api.WorkerCounts(active=2) and status.last_checkpoint_step == 100
    assert status.result["testAccuracy"] == 0.97 and status.completion_time is None
    out = to_json(status)
    assert out["lastCheckpointStep"] == 100 and out["conditions"][0]["lastTransitionTime"] == "2024-01-02T03:04:05Z"
    assert parse_status(out) == status
    assert parse_status(None) == JobStatus()


def test_status_errors() -> None:
    with pytest.raises(SpecError) as info:
        parse_status({"phase": "Done", "conditions": [{"type": "X"}], "startTime": "yesterday"})
    assert [str(e) for e in info.value.errors] == [
        "status.phase: 'Done' is not one of Pending, Running, Restarting, Succeeded, Failed, Suspended",
        "status.conditions[0].status: required field is missing",
        "status.startTime: expected an RFC 3339 time such as 2024-01-02T03:04:05Z, got 'yesterday'",
    ]
