"""Every example manifest is a valid job (model and CRD schema), one per mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from disttrain_api import crd
from disttrain_api import model as api
from disttrain_api.validation import load_job

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
BY_MODE = {
    "data": "data-parallel.yaml",
    "pipeline": "pipeline.yaml",
    "tensor": "tensor.yaml",
    "hybrid": "hybrid.yaml",
    "federated": "federated.yaml",
    "paramserver": "paramserver.yaml",
}
# Further examples of a mode: file -> mode.
MORE = {"pipedream.yaml": "pipeline", "gpt-tokens.yaml": "data"}


def load(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d is not None]
    assert len(docs) == 1, name
    return docs[0]


def test_one_example_per_mode() -> None:
    assert set(BY_MODE) == set(api.Mode.__args__)  # type: ignore[attr-defined]
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted([*BY_MODE.values(), *MORE])


@pytest.mark.parametrize(("mode", "name"), sorted([*BY_MODE.items(), *((m, f) for f, m in MORE.items())]))
def test_example_is_valid(mode: str, name: str) -> None:
    obj = load(name)
    job = load_job(obj)  # raises SpecError listing every problem
    assert job.spec.mode == mode
    assert (EXAMPLES / name).read_text().startswith("#"), "every example starts with a comment saying what it shows"
    # The API server would accept it too, without pruning anything.
    schema = crd.openapi_schema()
    assert crd.schema_errors(obj, schema, "") == []


def test_data_parallel_example_is_the_demo() -> None:
    spec = load_job(load("data-parallel.yaml")).spec
    assert (spec.model.name, spec.data.name) == ("mlp", "digits")
    assert (spec.workers.replicas, spec.workers.procs_per_worker, spec.workers.resources.gpus) == (2, 1, 0)
    assert spec.training.precision == "fp32"
    # e2e tests use their own copy with a checkpoint claim; the example uses an emptyDir.
    assert spec.checkpoint.volume == {}
    assert spec.elastic is None and spec.federated is None and spec.param_server is None
