"""Pure builders: every mode's children, without a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from disttrain_api import constants as c
from disttrain_api import model as api
from disttrain_operator.topology import BUILDERS, build_children, gang_role
from disttrain_operator.topology.common import BuildContext


def spec(**over: Any) -> api.JobSpec:
    base: dict[str, Any] = {"mode": "data", "workers": {"replicas": 2}}
    base.update(over)
    return api.parse_spec(base)


def ctx(**over: Any) -> BuildContext:
    values: dict[str, Any] = {"name": "job1", "namespace": "ns1", "uid": "uid-1", "image": "img:1", "replicas": 2}
    values.update(over)
    return BuildContext(**values)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_every_child_is_owned_and_labelled(mode: str) -> None:
    s = spec(mode=mode, workers={"replicas": 2})
    children = build_children(s, ctx())
    assert children.pods and children.config_maps and children.services
    for obj in children.all():
        meta = obj["metadata"]
        assert meta["namespace"] == "ns1"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "name": "job1", "uid": "uid-1",
            "controller": True, "blockOwnerDeletion": True,
        }
        assert meta["labels"][c.LABEL_JOB] == "job1"
    for pod in children.pods:
        labels = pod["metadata"]["labels"]
        assert labels[c.LABEL_ROLE] == gang_role(mode)
        assert labels[c.LABEL_REPLICA_INDEX] in ("0", "1")
        assert pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("mode", ["federated", "paramserver"])
def test_served_modes_have_server_deployment_and_service(mode: str) -> None:
    children = build_children(spec(mode=mode), ctx())
    (dep,) = children.deployments
    role = c.ROLE_AGGREGATOR if mode == "federated" else c.ROLE_SERVER
    assert dep["kind"] == "Deployment" and dep["metadata"]["name"] == f"job1-{role}"
    assert dep["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    assert dep["spec"]["selector"]["matchLabels"] == {c.LABEL_JOB: "job1", c.LABEL_ROLE: role}
    assert dep["spec"]["template"]["metadata"]["labels"][c.LABEL_ROLE] == role
    svc = next(s for s in children.services if s["metadata"]["name"] == f"job1-{role}")
    port = 50051 if mode == "federated" else 50052
    assert svc["spec"]["ports"][0]["port"] == port
    assert svc["spec"]["selector"][c.LABEL_ROLE] == role
    for pod in children.pods:
        env = env_of(pod)
        assert env[c.ENV_SERVER_ADDR] == f"job1-{role}.ns1.svc.cluster.local:{port}"
        assert env[c.ENV_ROLE] == gang_role(mode)


def test_gang_pods_env_contract_dns_and_service() -> None:
    children = build_children(spec(), ctx(attempt=3))
    (svc,) = children.services
    assert svc["metadata"]["name"] == "job1"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {c.LABEL_JOB: "job1", c.LABEL_ROLE: c.ROLE_WORKER}
    names = [p["metadata"]["name"] for p in children.pods]
    assert names == ["job1-worker-0", "job1-worker-1"]
    for i, pod in enumerate(children.pods):
        assert pod["spec"]["hostname"] == f"job1-worker-{i}" and pod["spec"]["subdomain"] == "job1"
        assert pod["metadata"]["labels"][c.LABEL_RESTART_ATTEMPT] == "3"
        env = env_of(pod)
        assert env[c.ENV_MASTER_ADDR] == "job1-worker-0.job1.ns1.svc.cluster.local"
        assert env[c.ENV_MASTER_PORT] == str(c.DEFAULT_MASTER_PORT)
        assert env[c.ENV_WORLD_SIZE] == "2"
        assert env[c.ENV_RANK] == str(i) and env[c.ENV_NODE_RANK] == str(i) and env[c.ENV_LOCAL_RANK] == "0"
        assert env[c.ENV_NPROC_PER_NODE] == "1"
        assert env[c.ENV_JOB] == "job1"
        assert env[c.ENV_RESTART_ATTEMPT] == "3"
        assert env[c.ENV_JOB_UID] == ctx().uid  # with the attempt, names the checkpoint writer (fencing)
        assert env[c.ENV_CONFIG] == f"{c.CONFIG_MOUNT_DIR}/{c.CONFIG_FILENAME}"
        assert env[c.ENV_CHECKPOINT_DIR] == "/checkpoints"


def test_procs_per_worker_leaves_rank_to_the_trainer() -> None:
    children = build_children(spec(workers={"replicas": 2, "procsPerWorker": 4}), ctx())
    env = env_of(children.pods[1])
    assert c.ENV_RANK not in env and c.ENV_LOCAL_RANK not in env
    assert env[c.ENV_NODE_RANK] == "1" and env[c.ENV_NPROC_PER_NODE] == "4" and env[c.ENV_WORLD_SIZE] == "8"
    ports = [p["containerPort"] for p in children.pods[1]["spec"]["containers"][0]["ports"]]
    assert [9400, 9401, 9402, 9403] == [p for p in ports if 9400 <= p < 9500]


def test_config_map_is_the_spec_json_and_is_mounted() -> None:
    s = spec()
    children = build_children(s, ctx())
    (cm,) = children.config_maps
    assert json.loads(cm["data"][c.CONFIG_FILENAME]) == api.to_json(s)
    pod = children.pods[0]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "config")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == c.CONFIG_MOUNT_DIR


def test_config_map_carries_the_shrunk_gang_size() -> None:
    s = spec(workers={"replicas": 4}, elastic={"minReplicas": 2, "maxReplicas": 4})
    children = build_children(s, ctx(replicas=2))
    assert json.loads(children.config_maps[0]["data"][c.CONFIG_FILENAME])["workers"]["replicas"] == 2
    assert len(children.pods) == 2 and env_of(children.pods[0])[c.ENV_WORLD_SIZE] == "2"


def test_checkpoint_volume_default_and_given() -> None:
    # Default: the job's own claim (tests/unit/test_checkpoint_claim.py), never an emptyDir.
    pod = build_children(spec(), ctx()).pods[0]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints")
    assert vol == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "job1-checkpoints"}}
    pod = build_children(spec(checkpoint={"volume": {"emptyDir": {}}}), ctx()).pods[0]  # asked for explicitly
    assert next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints") == {"name": "checkpoints",
                                                                                     "emptyDir": {}}
    claim = {"persistentVolumeClaim": {"claimName": "checkpoints"}}
    pod = build_children(spec(checkpoint={"path": "/ckpt", "volume": claim}), ctx()).pods[0]
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints")
    assert vol == {"name": "checkpoints", **claim}
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "checkpoints")
    assert mount["mountPath"] == "/ckpt"
    # Validation refuses a hostPath; should one reach the builder all the same (a spec an older
    # operator accepted), the pod gets an emptyDir, never the node's filesystem.
    host = {"hostPath": {"path": "/var/lib/disttrain/checkpoints", "type": "Directory"}}
    pod = build_children(spec(checkpoint={"path": "/ckpt", "volume": host}), ctx()).pods[0]
    assert next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints") == {"name": "checkpoints",
                                                                                     "emptyDir": {}}


def test_security_context_is_restricted() -> None:
    pod = build_children(spec(), ctx()).pods[0]
    psc = pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001 and psc["fsGroup"] == 10001
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    csc = pod["spec"]["containers"][0]["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert csc["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in container["ports"]


@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_grace_period_comes_from_the_spec(mode: str) -> None:
    """The trainer checkpoints its step on SIGTERM: the pods (servers too) give it the job's grace period."""
    for s, want in ((spec(mode=mode), 30), (spec(mode=mode, runPolicy={"terminationGracePeriodSeconds": 90}), 90)):
        children = build_children(s, ctx())
        pod_specs = [p["spec"] for p in children.pods] + [d["spec"]["template"]["spec"] for d in children.deployments]
        assert pod_specs and {ps["terminationGracePeriodSeconds"] for ps in pod_specs} == {want}


def test_resources_and_gpu_toleration() -> None:
    pod = build_children(spec(workers={"replicas": 1, "resources": {"cpu": "500m", "memory": "1Gi"}}),
                         ctx(replicas=1)).pods[0]
    res = pod["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}
    assert "tolerations" not in pod["spec"]
    pod = build_children(spec(workers={"replicas": 1, "resources": {"gpus": 2}}), ctx(replicas=1)).pods[0]
    assert pod["spec"]["containers"][0]["resources"]["limits"][c.GPU_RESOURCE] == "2"
    assert {"key": c.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_template_overrides_never_lose_user_env() -> None:
    template = {
        "env": [{"name": c.ENV_MASTER_PORT, "value": "12345"}, {"name": "EXTRA", "value": "1"}],
        "nodeSelector": {"pool": "train"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "containers": [{"name": "trainer", "command": ["sleep", "1"],
                        "env": [{"name": c.ENV_DEVICE, "value": "cpu"}]}],
        "priorityClassName": "high",
        "labels": {"team": "ml"},
    }
    pod = build_children(spec(workers={"replicas": 2, "template": template}), ctx()).pods[0]
    env = env_of(pod)
    assert env[c.ENV_MASTER_PORT] == "12345"  # the user's value wins
    assert env["EXTRA"] == "1" and env[c.ENV_DEVICE] == "cpu"
    assert env[c.ENV_WORLD_SIZE] == "2"  # ours still present
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names))
    assert pod["spec"]["containers"][0]["command"] == ["sleep", "1"]
    assert pod["spec"]["nodeSelector"] == {"pool": "train"}
    assert pod["spec"]["priorityClassName"] == "high"
    assert {"key": "dedicated", "operator": "Exists"} in pod["spec"]["tolerations"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"][c.LABEL_JOB] == "job1"  # ours cannot be overridden


def test_mesh_annotation_for_hybrid() -> None:
    s = spec(mode="hybrid", workers={"replicas": 4, "procsPerWorker": 2},
             parallelism={"tensor": 2, "pipeline": 2}, model={"name": "gpt", "hidden": 64, "heads": 4, "layers": 4})
    pod = build_children(s, ctx(replicas=4)).pods[0]
    assert pod["metadata"]["annotations"][c.ANNOTATION_MESH] == "dp=2,pp=2,tp=2"


@pytest.mark.parametrize("mode", ["federated", "paramserver"])
def test_servers_keep_serving_until_stopped_clients_do_not(mode: str) -> None:
    children = build_children(spec(mode=mode), ctx())
    for dep in children.deployments:
        assert env_of(dep["spec"]["template"])[c.ENV_SERVE_UNTIL_STOPPED] == "1"
    assert all(c.ENV_SERVE_UNTIL_STOPPED not in env_of(p) for p in children.pods)
