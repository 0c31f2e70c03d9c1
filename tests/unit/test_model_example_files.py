"""examples/my_model: its job manifest is valid (model and CRD schema) and names the package's
factory; its Dockerfile builds FROM the trainer image and passes hadolint; the factory satisfies
the data and pipeline contracts (tests/dist/test_model_example.py trains it)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from disttrain_api import crd
from disttrain_api.model import parse_spec
from disttrain_api.validation import load_job
from disttrain_trainer.data import load_dataset
from disttrain_trainer.models import build_model
from disttrain_trainer.parallel.blocks import split_blocks
from disttrain_trainer.process.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "my_model"


def test_job_manifest_is_valid_and_uses_the_package() -> None:
    obj = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    job = load_job(obj)
    assert job.spec.model.name == "my_model.model:factory"
    assert crd.schema_errors(obj, crd.openapi_schema(), "") == []
    assert 'packages = ["my_model"]' in (EXAMPLE / "pyproject.toml").read_text()


def test_dockerfile_builds_from_the_trainer_image_and_passes_hadolint() -> None:
    text = (EXAMPLE / "Dockerfile").read_text()
    assert "FROM ${TRAINER_IMAGE}" in text and text.rstrip().endswith("USER 10001:10001")
    hadolint = Path(sys.executable).parent / "hadolint"
    res = subprocess.run([str(hadolint), "--config", str(ROOT / ".hadolint.yaml"), str(EXAMPLE / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_factory_meets_the_data_and_pipeline_contracts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    importlib.invalidate_caches()
    spec = parse_spec({"model": {"name": "my_model.model:factory", "hidden": 16, "layers": 2},
                       "data": {"name": "digits", "batchSize": 32}})  # fmt: skip
    ds = load_dataset(spec, tmp_path)
    model = build_model(spec, ds)
    x = torch.from_numpy(ds.batch(torch.arange(4).numpy())[0])
    out = x
    for block in split_blocks(model, name=spec.model.name):
        out = block(out)
    assert torch.equal(out, model(x)) and out.shape == (4, ds.num_classes)
    text = parse_spec({"model": {"name": "my_model.model:factory"}, "data": {"name": "pytext", "batchSize": 8}})
    with pytest.raises(ConfigError, match="classifies; data pytext"):
        build_model(text, load_dataset(text, tmp_path))


def test_language_model_factory_meets_the_data_and_pipeline_contracts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    importlib.invalidate_caches()
    spec = parse_spec({"model": {"name": "my_model.lm:factory", "hidden": 16, "layers": 2, "blockSize": 8},
                       "data": {"name": "pytext", "batchSize": 8}})  # fmt: skip
    ds = load_dataset(spec, tmp_path)
    model = build_model(spec, ds)
    x = torch.from_numpy(ds.batch(torch.arange(3).numpy())[0])
    out = x
    for block in split_blocks(model, name=spec.model.name):
        out = block(out)
    assert torch.equal(out, model(x)) and out.shape == (3, 8, ds.num_classes)
    # Causal: a change at the last position leaves every earlier prediction as it was.
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % ds.num_classes
    assert torch.equal(model(changed)[:, :-1], out[:, :-1])
    digits = parse_spec({"model": {"name": "my_model.lm:factory"}, "data": {"name": "digits", "batchSize": 8}})
    with pytest.raises(ConfigError, match="predicts tokens; data digits"):
        build_model(digits, load_dataset(digits, tmp_path))
