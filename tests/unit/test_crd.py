"""The CRD agrees with the typed model: the committed file is what the generator
writes (drift), every model field appears with the right type, enum, bounds and
default (field-by-field walk), the schema is structural, and the API server's
defaulting of an empty spec gives exactly the model's defaults."""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import pytest
import yaml
from disttrain_api import crd
from disttrain_api import model as api
from disttrain_api.dataparse import is_bool_or_enum, is_optional, json_name, strip_optional

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "manifests" / "crd" / "disttrainjobs.yaml"


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


def version_of(doc: dict[str, Any]) -> dict[str, Any]:
    (version,) = doc["spec"]["versions"]
    return version


def schema_of(doc: dict[str, Any]) -> dict[str, Any]:
    return version_of(doc)["schema"]["openAPIV3Schema"]


def test_committed_crd_is_up_to_date() -> None:
    assert CRD_FILE.read_text() == crd.crd_yaml(), (
        "manifests/crd/disttrainjobs.yaml drifted from the model in api.py: run `make manifests`"
    )


def test_yaml_round_trip(committed: dict[str, Any]) -> None:
    assert committed == crd.crd()


class _Yaml11Loader(yaml.SafeLoader):
    """A YAML 1.1 reader as the API server's (go-yaml v2): y/Y/n/N are booleans too (PyYAML's are not)."""


_Yaml11Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in "yYnN":
    _Yaml11Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), [_first])
_Yaml11Loader.add_constructor("tag:yaml.org,2002:bool", lambda loader, node: node.value.lower() in ("y", "yes", "on",
                                                                                                    "true"))


def test_the_api_server_reads_the_crd_as_written() -> None:
    # Every string stays a string for a YAML 1.1 reader: `default: y` (unquoted) is a boolean there.
    for path in (CRD_FILE, ROOT / "charts" / "disttrain" / "crds" / "disttrainjobs.yaml"):
        assert yaml.load(path.read_text(), Loader=_Yaml11Loader) == crd.crd(), path
    assert yaml.load("default: y", Loader=_Yaml11Loader) == {"default": True}  # the reader is YAML 1.1's


def test_crd_metadata(committed: dict[str, Any]) -> None:
    assert committed["apiVersion"] == "apiextensions.k8s.io/v1"
    assert committed["metadata"]["name"] == "disttrainjobs.disttrain.dev"
    spec = committed["spec"]
    assert spec["group"] == "disttrain.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "DistTrainJob",
        "listKind": "DistTrainJobList",
        "plural": "disttrainjobs",
        "singular": "disttrainjob",
        "shortNames": ["dtj"],
        "categories": ["disttrain"],
    }
    version = version_of(committed)
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Mode", "string", ".spec.mode"),
        ("Workers", "integer", ".status.replicas"),
        ("Phase", "string", ".status.phase"),
        ("Step", "integer", ".status.step"),
        ("Progress", "number", ".status.progress.percent"),
        ("ETA", "string", ".status.progress.eta"),
        ("Comm", "number", ".status.commFraction"),
        ("Restarts", "integer", ".status.restarts"),
        ("Disruptions", "integer", ".status.disruptions"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    # Shown by `kubectl get -o wide` only: the default table keeps the columns of DESIGN.md.
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")] == ["Disruptions"]


def test_schema_is_structural(committed: dict[str, Any]) -> None:
    assert crd.structural_problems(schema_of(committed)) == []


def test_structural_checker_catches_violations() -> None:
    assert crd.structural_problems({"type": "object", "properties": {"a": {"description": "no type"}}}) == [
        "openAPIV3Schema.properties.a: type must be set"
    ]
    assert crd.structural_problems(
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}
    ) == [
        "openAPIV3Schema: keyword additionalProperties is not emitted by this generator",
        "openAPIV3Schema: additionalProperties together with properties",
    ]
    assert crd.structural_problems({"type": "integer", "minimum": 1, "default": 0}) == [
        "openAPIV3Schema.default: default: must be >= 1"
    ]


def test_only_features_kubernetes_1_20_serves(committed: dict[str, Any]) -> None:
    text = CRD_FILE.read_text()
    for newer in ("x-kubernetes-validations", "x-kubernetes-map-type", "selectableFields", "oneOf", "$ref"):
        assert newer not in text
    meta = schema_of(committed)["properties"]["metadata"]
    # Structural rule: at the root, metadata may restrict name/generateName only.
    assert set(meta) == {"type", "properties"} and set(meta["properties"]) == {"name"}
    assert meta["properties"]["name"]["maxLength"] == api.MAX_JOB_NAME


def _walk(cls: Any, schema: dict[str, Any], path: str, *, defaults: bool) -> None:
    hints = get_type_hints(cls)
    fields = {json_name(f): f for f in dataclasses.fields(cls)}
    assert schema["type"] == "object", path
    assert set(schema["properties"]) == set(fields), f"{path}: schema and model disagree on field names"
    required = set(schema.get("required", []))
    for name, f in fields.items():
        sub, prop, tp = f"{path}.{name}", schema["properties"][name], hints[f.name]
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert (name in required) == (not has_default), f"{sub}: required"
        assert prop.get("nullable", False) == is_optional(tp), f"{sub}: nullable"
        assert prop.get("description", "") == f.metadata.get("description", ""), f"{sub}: description"
        base = strip_optional(tp)
        for key, meta_key in (("minimum", "minimum"), ("maximum", "maximum"), ("pattern", "pattern")):
            where = prop["items"] if key == "pattern" and get_origin(base) is tuple and "items" in prop and (
                get_args(base)[0] is str) else prop  # a list of strings: the pattern is each item's
            assert where.get(key) == f.metadata.get(meta_key), f"{sub}: {key}"
        assert prop.get("exclusiveMinimum", False) == bool(f.metadata.get("exclusive_minimum")), sub
        if defaults and has_default:
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value is None:
                assert "default" not in prop, f"{sub}: an optional block has no default"
            elif dataclasses.is_dataclass(base):
                assert prop["default"] == {}, f"{sub}: nested objects default to {{}} so the server fills them"
            else:
                assert prop["default"] == api.to_json(value), f"{sub}: default"
        else:
            assert "default" not in prop, f"{sub}: no default expected"
        if is_bool_or_enum(base):  # true, false or a name: no one type, the enum says which
            assert "type" not in prop and prop["x-kubernetes-preserve-unknown-fields"] is True, sub
            assert prop["enum"] == [False, True, *get_args(get_args(base)[1])], sub
        elif get_origin(base) is Literal:
            assert (prop["type"], prop["enum"]) == ("string", list(get_args(base))), sub
        elif get_origin(base) is tuple and get_args(base)[0] is str:
            assert (prop["type"], prop["items"]["type"]) == ("array", "string"), sub
        elif get_origin(base) is tuple:
            assert prop["type"] == "array", sub
            _walk(get_args(base)[0], prop["items"], f"{sub}[]", defaults=defaults)
        elif dataclasses.is_dataclass(base):
            _walk(base, prop, sub, defaults=defaults)
        elif base is api.Quantity:
            assert prop["x-kubernetes-int-or-string"] is True and "type" not in prop, sub
        elif base is api.Object:
            assert (prop["type"], prop["x-kubernetes-preserve-unknown-fields"]) == ("object", True), sub
        elif base is api.Time:
            assert (prop["type"], prop["format"]) == ("string", "date-time"), sub
        else:
            expected = {bool: "boolean", int: "integer", float: "number", str: "string"}[typing.cast(type, base)]
            assert prop["type"] == expected, sub


def test_spec_schema_matches_model_field_by_field(committed: dict[str, Any]) -> None:
    spec = schema_of(committed)["properties"]["spec"]
    assert spec["default"] == {}
    _walk(api.JobSpec, spec, "spec", defaults=True)


def test_status_schema_matches_model_field_by_field(committed: dict[str, Any]) -> None:
    status = schema_of(committed)["properties"]["status"]
    _walk(api.JobStatus, status, "status", defaults=False)
    # kopf keeps its progress here; a structural schema would prune it otherwise.
    assert status["properties"]["kopf"]["x-kubernetes-preserve-unknown-fields"] is True


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """The API server's defaulting: absent properties with a default get it, recursively."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for name, sub in schema["properties"].items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(out[name], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def drop_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_nones(v) for k, v in value.items() if v is not None}
    return value


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"mode": "federated", "federated": {"partition": {}}},
        {"workers": {"resources": {"gpus": 1}}, "elastic": {}, "paramServer": {}},
    ],
    ids=["empty", "federated", "optional-blocks"],
)
def test_server_defaults_equal_model_defaults(committed: dict[str, Any], spec: dict[str, Any]) -> None:
    root = schema_of(committed)
    defaulted = apply_defaults({"spec": spec}, root)["spec"]
    # The server leaves optional fields absent where the model says None.
    assert defaulted == drop_nones(api.to_json(api.parse_spec(spec)))
    assert api.parse_spec(defaulted) == api.parse_spec(spec)
    assert crd.schema_errors(defaulted, root["properties"]["spec"], "spec") == []


@pytest.mark.parametrize(
    ("spec", "model_path"),
    [
        ({"mode": "ddp"}, "spec.mode"),
        ({"workers": {"replicas": 0}}, "spec.workers.replicas"),
        ({"workers": {"resources": {"gpus": -1}}}, "spec.workers.resources.gpus"),
        ({"workers": {"resources": {"cpu": 0.5}}}, "spec.workers.resources.cpu"),
        ({"workers": {"resources": {"memory": "2GB"}}}, "spec.workers.resources.memory"),
        ({"optimizer": {"lr": 0}}, "spec.optimizer.lr"),
        ({"training": {"activationCheckpointing": "always"}}, "spec.training.activationCheckpointing"),
        ({"runPolicy": {"suspend": "yes"}}, "spec.runPolicy.suspend"),
        ({"data": {"batchSize": 1.5}}, "spec.data.batchSize"),
        ({"federated": {"topkRatio": 0}}, "spec.federated.topkRatio"),
        ({"workerz": {}}, "spec.workerz"),
    ],
)
def test_schema_and_model_reject_the_same_values(
    committed: dict[str, Any], spec: dict[str, Any], model_path: str
) -> None:
    schema = schema_of(committed)["properties"]["spec"]
    assert [e.path for e in api.parse_job_partial({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                                   "metadata": {"name": "j"}, "spec": spec})[1]] == [model_path]
    problems = crd.schema_errors(spec, schema, "spec")
    assert len(problems) == 1 and problems[0].startswith(model_path + ":"), problems


def test_free_text_strings_are_nullable(committed: dict[str, Any]) -> None:
    # kube-apiserver 1.20 built with Go >= 1.19 (the local cluster's) rejects "" in a
    # non-nullable string field ("must be of type string: null"). Strings that may be
    # empty must therefore be nullable; the others are enums, patterns or required.
    loose: list[str] = []

    def walk(schema: dict[str, Any], path: str, required: bool) -> None:
        if schema.get("type") == "string" and not (
            required or schema.get("nullable") or "enum" in schema or "pattern" in schema or "format" in schema
        ):
            loose.append(path)
        for name, sub in schema.get("properties", {}).items():
            walk(sub, f"{path}.{name}", name in schema.get("required", []))
        if "items" in schema:
            walk(schema["items"], f"{path}[]", False)

    root = schema_of(committed)
    walk(root["properties"]["spec"], "spec", False)
    walk(root["properties"]["status"], "status", False)
    assert loose == []
