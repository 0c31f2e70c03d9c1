"""Every example manifest is accepted by the real API server, and the defaults the
server fills in from the CRD schema are exactly the typed model's defaults (the CRD
is generated from the model; this checks the generation end to end)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from disttrain_api import model as api
from disttrain_api.validation import load_job

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "manifests" / "examples").glob("*.yaml"))


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_accepted_and_defaulted_like_the_model(kubectl: Any, crd: None, namespace: str, path: Path) -> None:
    proc = kubectl.run("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", str(path))
    served = json.loads(proc.stdout)
    manifest = yaml.safe_load(path.read_text())
    expected = _drop_nulls(api.to_json(load_job(manifest).spec))
    assert served["spec"] == expected


def test_empty_spec_gets_every_model_default(kubectl: Any, crd: None, namespace: str) -> None:
    obj = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "defaults"}, "spec": {}}
    proc = kubectl.run("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-", input=yaml.safe_dump(obj))
    assert json.loads(proc.stdout)["spec"] == _drop_nulls(api.to_json(api.parse_spec({})))


def test_out_of_range_value_is_refused_naming_the_field(kubectl: Any, crd: None, namespace: str) -> None:
    obj = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "bad"},
           "spec": {"training": {"steps": 0, "precision": "fp8"}}}
    proc = kubectl.run("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert proc.returncode != 0
    assert "spec.training.steps" in proc.stderr and "spec.training.precision" in proc.stderr
