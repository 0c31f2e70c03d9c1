"""s3:// URIs in the spec at admission (field paths and reasons), and what the operator puts into
every pod for spec.objectStore: credentials by reference into the user's Secret, never read; the
checkpoint credentials only in the pods that write checkpoints, the data credentials in the others,
whose checkpoint volume is mounted read-only."""

from __future__ import annotations

from typing import Any

import pytest
from disttrain_api.validation import check_job
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext

GPT = {"name": "gpt", "hidden": 32, "layers": 1, "heads": 2, "blockSize": 16}
STORE = {"endpoint": "http://minio.storage:9000", "region": "eu-west-1", "credentialsSecret": "s3-creds"}


def manifest(mode: str = "data", **spec: Any) -> dict[str, Any]:
    body = {"mode": mode, "workers": {"replicas": 2}, "model": GPT,
            "data": {"path": "s3://corpus/tokens", "format": "tokens"}, **spec}  # fmt: skip
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "job1"},
            "spec": body}  # fmt: skip


def errors(**spec: Any) -> dict[str, str]:
    _, errs = check_job(manifest(**spec))
    return {e.path: e.message for e in errs}


def test_s3_data_and_checkpoints_with_an_object_store_are_valid() -> None:
    assert errors(checkpoint={"uri": "s3://ckpt/runs"}, objectStore=STORE) == {}
    assert errors(data={"path": "s3://corpus/train.bin", "format": "tokens"}, checkpoint={"uri": "s3://ckpt"}) == {}


@pytest.mark.parametrize(
    ("spec", "field", "needle"),
    [
        ({"data": {"path": "s3://Bad_Bucket/x", "format": "tokens"}}, "spec.data.path", "not an s3://bucket/key"),
        ({"data": {"path": "s3://corpus", "format": "tokens"}}, "spec.data.path", "names a whole bucket"),
        ({"data": {"path": "s3://corpus/a//b", "format": "tokens"}}, "spec.data.path", "empty path segment"),
        ({"data": {"path": "gs://corpus/x", "format": "tokens"}}, "spec.data.path", "only s3://"),
        ({"data": {"path": "s3://corpus/x", "format": "tokens", "volume": {"persistentVolumeClaim": {"claimName": "c"}}}},
         "spec.data.volume", "from object storage"),
        ({"checkpoint": {"uri": "/checkpoints"}}, "spec.checkpoint.uri", "s3://bucket/prefix"),
        ({"checkpoint": {"uri": "s3://x"}}, "spec.checkpoint.uri", "not an s3://bucket/key"),
        ({"checkpoint": {"uri": "s3://ckpt/p", "volume": {"persistentVolumeClaim": {"claimName": "c"}}}},
         "spec.checkpoint.uri", "not together with spec.checkpoint.volume"),
        ({"objectStore": {"endpoint": "minio:9000"}}, "spec.objectStore.endpoint", ""),
        ({"objectStore": {"credentialsSecret": "Not_A_Name"}}, "spec.objectStore.credentialsSecret", ""),
        ({"mode": "federated", "model": {"name": "mlp"}, "checkpoint": {"uri": "s3://ckpt/runs"}, "objectStore": STORE},
         "spec.objectStore.dataCredentialsSecret", "federated clients read s3://corpus/tokens"),
    ],
)
def test_malformed_uris_and_conflicts_name_the_field(spec: dict[str, Any], field: str, needle: str) -> None:
    errs = errors(**spec)
    assert field in errs, errs
    assert needle in errs[field]


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("mode", ["data", "federated", "paramserver"])
@pytest.mark.parametrize("data_secret", [None, "s3-data"])
def test_writers_get_the_checkpoint_credentials_and_readers_the_data_credentials(mode: str,
                                                                                 data_secret: str | None) -> None:
    store = {**STORE, **({"dataCredentialsSecret": data_secret} if data_secret else {})}
    spec, _ = check_job(manifest(mode, checkpoint={"uri": "s3://ckpt/runs"}, objectStore=store,
                                 **({"model": {"name": "mlp"}, "data": {"name": "digits"}} if mode != "data" else {})))  # fmt: skip
    assert spec is not None
    children = build_children(spec.spec, BuildContext(name="job1", namespace="ns", uid="u-1", image="img", replicas=2))
    pods = children.pods + [d["spec"]["template"] for d in children.deployments]
    readers = {"data": set(), "federated": {"client-0", "client-1"}, "paramserver": {"worker-1"}}[mode]
    seen = set()
    for pod in pods:
        labels = pod["metadata"]["labels"]
        who = f"{labels['disttrain.dev/role']}-{labels.get('disttrain.dev/replica-index', 0)}"
        seen.add(who)
        env = _env(pod)
        secret = (data_secret if who in readers else "s3-creds")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            if secret is None:
                assert key not in env, (who, env[key])
            else:
                assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}, who
        assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.storage:9000"
        assert env["AWS_REGION"]["value"] == env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
        mount, = (m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "checkpoints")
        assert mount.get("readOnly", False) is (who in readers), (who, mount)
    assert readers <= seen
    # The operator creates no Secret for it and reads none: only references.
    assert not any(s["metadata"]["name"] in ("s3-creds", "s3-data") for s in children.secrets)


def test_without_checkpoint_uri_readers_get_the_one_secret_and_still_mount_read_only() -> None:
    spec, errs = check_job(manifest("federated", model={"name": "mlp"}, objectStore=STORE))
    assert spec is not None, errs
    client = build_children(spec.spec, BuildContext(name="job1", namespace="ns", image="img", replicas=2)).pods[0]
    assert _env(client)["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"
    mounts = [m for c in client["spec"]["containers"] for m in c["volumeMounts"] if m["name"] == "checkpoints"]
    assert [(m["mountPath"], m.get("readOnly")) for m in mounts] == [("/checkpoints", True)]


def test_an_env_var_the_user_set_wins_and_no_store_means_no_aws_env() -> None:
    template = {"env": [{"name": "AWS_ENDPOINT_URL", "value": "http://mine:9000"}]}
    spec, _ = check_job(manifest(objectStore=STORE, workers={"replicas": 2, "template": template}))
    assert spec is not None
    pod = build_children(spec.spec, BuildContext(name="job1", namespace="ns", image="img", replicas=2)).pods[0]
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.count("AWS_ENDPOINT_URL") == 1 and _env(pod)["AWS_ENDPOINT_URL"]["value"] == "http://mine:9000"
    plain, _ = check_job(manifest())
    assert plain is not None
    pod = build_children(plain.spec, BuildContext(name="job1", namespace="ns", image="img", replicas=2)).pods[0]
    assert not any(n.startswith("AWS_") for n in _env(pod))
