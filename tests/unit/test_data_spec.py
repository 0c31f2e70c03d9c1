"""spec.data's file sources at admission: what can be refused without the files, with the field path."""

from __future__ import annotations

from typing import Any

import pytest
from disttrain_api import model as api
from disttrain_api.validation import check_job
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext

GPT = {"name": "gpt", "hidden": 32, "layers": 1, "heads": 2, "blockSize": 16}


def manifest(data: dict[str, Any], model: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "job1"},
            "spec": {"mode": "data", "workers": {"replicas": 2}, "model": model or GPT, "data": data, **spec}}


def errors(data: dict[str, Any], model: dict[str, Any] | None = None, **spec: Any) -> dict[str, str]:
    _, errs = check_job(manifest(data, model, **spec))
    return {e.path: e.message for e in errs}


def test_without_name_or_path_the_builtin_digits_is_used() -> None:
    assert api.parse_spec({}).data.builtin == "digits"
    assert api.parse_spec({"data": {"path": "corpus", "format": "tokens"}}).data.builtin is None


def test_a_tokens_directory_for_the_gpt_is_valid() -> None:
    assert errors({"path": "corpus", "format": "tokens", "tokenDtype": "uint32", "vocabSize": 50304}) == {}


def test_a_builtin_name_and_a_path_together_are_refused() -> None:
    msg = errors({"name": "pytext", "path": "corpus", "format": "tokens"})["spec.data.path"]
    assert "not both" in msg and "remove spec.data.name" in msg


@pytest.mark.parametrize(
    ("data", "model", "path", "needle"),
    [
        ({"path": "corpus"}, None, "spec.data.format", "required with spec.data.path"),
        ({"format": "tokens"}, None, "spec.data.path", "required with format tokens"),
        ({"format": "module"}, {"name": "mlp"}, "spec.data.factory", "required with format module"),
        ({"path": "x", "format": "npy", "factory": "a.b:c"}, {"name": "mlp"}, "spec.data.factory", "only read"),
        ({"path": "t.parquet", "format": "parquet"}, {"name": "mlp"}, "spec.data.featureColumns", "required"),
        ({"path": "d", "format": "npz", "featureColumns": ["a"]}, {"name": "mlp"}, "spec.data.featureColumns",
         "only read with format parquet, jsonl, csv, hfdataset"),
        ({"path": "d", "format": "npy", "vocabSize": 5}, {"name": "mlp"}, "spec.data.vocabSize", "only read"),
        ({"path": "d", "format": "tokens", "classes": 5}, None, "spec.data.classes", "not read with format tokens"),
        ({"path": "d", "format": "npy"}, None, "spec.data.format", "does not fit model gpt"),
        ({"path": "d", "format": "tokens"}, {"name": "mlp"}, "spec.data.format", "does not fit model mlp"),
        ({"path": "d", "format": "feather"}, None, "spec.data.format", "is not one of"),
        ({"path": "d", "format": "csv"}, {"name": "mlp"}, "spec.data.featureColumns", "required with format csv"),
        ({"path": "d", "format": "tokens", "tokenDtype": "float32"}, None, "spec.data.tokenDtype", "is not one of"),
    ],
)
def test_incomplete_or_mismatched_file_sources_name_the_field(data, model, path, needle) -> None:  # noqa: ANN001
    errs = errors(data, model)
    assert path in errs and needle in errs[path], errs


@pytest.mark.parametrize(
    ("data", "loss", "path", "needle"),
    [
        ({"path": "d", "format": "tokens"}, "mse", "spec.training.loss", "mse needs numeric labels of your own rows"),
        ({"name": "digits"}, "mse", "spec.training.loss", "not data digits"),
        ({"path": "d", "format": "npy"}, "l1", "spec.training.loss", "does not match"),
        ({"path": "d", "format": "npy"}, "mypkg.losses:huber", None, ""),
        ({"path": "d", "format": "csv", "featureColumns": ["a"]}, "mse", None, ""),
    ],
)
def test_the_loss_fits_the_data(data, loss, path, needle) -> None:  # noqa: ANN001
    errs = errors(data, {"name": "mlp"}, training={"loss": loss})
    if path is None:
        assert not errs, errs
    else:
        assert path in errs and needle in errs[path], errs


CLAIM = {"persistentVolumeClaim": {"claimName": "corpus"}}


@pytest.mark.parametrize(
    ("data", "path", "needle"),
    [
        ({"volume": {"hostPath": {"path": "/srv"}}}, "spec.data.volume.hostPath", "not allowed in worker pods"),
        ({"volume": {**CLAIM, "name": "x"}}, "spec.data.volume.name", "only the volume type"),
        ({"volume": CLAIM, "mountPath": "/checkpoints/data"}, "spec.data.mountPath", "overlaps spec.checkpoint.path"),
        ({"volume": CLAIM, "mountPath": "/etc/disttrain"}, "spec.data.mountPath", "collides"),
        ({"volume": CLAIM, "path": "/elsewhere/corpus"}, "spec.data.path", "outside spec.data.mountPath"),
        ({"volume": CLAIM, "mountPath": "/scratch"}, "spec.data.mountPath", "already mounted by spec.workers.template"),
    ],
)
def test_a_data_volume_that_cannot_be_mounted_as_given_is_refused(data, path, needle) -> None:  # noqa: ANN001
    template = {"volumes": [{"name": "scratch", "emptyDir": {}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    errs = errors({"path": "corpus", "format": "tokens", **data}, workers={"replicas": 2, "template": template})
    assert path in errs and needle in errs[path], errs


def pods(data: dict[str, Any], mode: str = "data") -> list[dict[str, Any]]:
    spec = api.parse_spec({"mode": mode, "workers": {"replicas": 2}, "model": GPT, "data": data})
    ctx = BuildContext(name="job1", namespace="ns1", uid="uid-1", image="img:1", replicas=2)
    children = build_children(spec, ctx)
    return [*children.pods, *(d["spec"]["template"] for d in children.deployments)]


@pytest.mark.parametrize("mode", ["data", "federated", "paramserver"])
def test_the_data_volume_is_mounted_read_only_in_every_pod(mode: str) -> None:
    for pod in pods({"path": "corpus", "format": "tokens", "volume": CLAIM, "mountPath": "/corpus"}, mode):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["dataset"] == {"name": "dataset", **CLAIM}
        (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
        (mount,) = [m for m in trainer["volumeMounts"] if m["name"] == "dataset"]
        assert mount == {"name": "dataset", "mountPath": "/corpus", "readOnly": True}


def test_no_data_volume_mounts_nothing() -> None:
    for pod in pods({"path": "/opt/corpus", "format": "tokens"}):
        assert "dataset" not in {v["name"] for v in pod["spec"]["volumes"]}
        assert all(m["name"] != "dataset" for c in pod["spec"]["containers"] for m in c.get("volumeMounts", []))


def to_manifest(job: Any) -> dict[str, Any]:
    return manifest(api.to_json(job.spec)["data"], api.to_json(job.spec)["model"])


def test_disttrain_local_resolves_a_relative_path_against_the_manifest_folder(tmp_path) -> None:  # noqa: ANN001
    import yaml
    from disttrain_cli.local_cmd import load_manifest

    folder = tmp_path / "project"
    folder.mkdir()
    for data, expected in (({"path": "corpus", "format": "tokens", "volume": CLAIM}, str(folder / "corpus")),
                           ({"path": "/abs/corpus", "format": "tokens"}, "/abs/corpus")):
        f = folder / "job.yaml"
        f.write_text(yaml.safe_dump(manifest(data)))
        job, problems = load_manifest(str(f))
        assert problems == [] and job.spec.data.path == expected
        # Nothing is mounted locally, and the trainer's own check of the spec still passes.
        assert not job.spec.data.volume and check_job(to_manifest(job))[1] == []
