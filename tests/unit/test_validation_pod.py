"""What a spec may ask of its pods (pod_rules.py through validation): job names every
derived object can carry, mount paths the operator keeps, volume types and the
workers.template allow-list; each refusal names the field and the fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from disttrain_api.model import SpecError
from disttrain_api.validation import check_job, load_job


def manifest(name: str = "job", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
            "metadata": {"name": name, "namespace": "ns"}, "spec": {"workers": {"replicas": 2}, **spec}}


def errors(obj: dict[str, Any]) -> dict[str, str]:
    """field path -> message (the first per path)."""
    found: dict[str, str] = {}
    for e in check_job(obj)[1]:
        found.setdefault(e.path, e.message)
    return found


def template(**fields: Any) -> dict[str, Any]:
    return {"workers": {"replicas": 2, "template": fields}}


@pytest.mark.parametrize("name", ["1job", "-job", "job-", "Job", "j_b", "j.b", "j" * 46])
def test_job_names_that_cannot_name_a_service_are_refused(name: str) -> None:
    message = errors(manifest(name))["metadata.name"]
    assert "DNS-1035 label" in message and "starting with a letter" in message and "45" in message


@pytest.mark.parametrize("name", ["j", "job-1", "a" * 45])
def test_dns_1035_names_pass(name: str) -> None:
    assert load_job(manifest(name)).metadata.name == name


@pytest.mark.parametrize("path", ["/etc/disttrain", "/etc/disttrain/ckpt", "/etc", "/", "/run/disttrain",
                                  "/run/disttrain/x", "/run", "/tmp", "/dev", "/dev/termination-log",
                                  "/ckpt/../etc/disttrain", "//etc/disttrain"])
def test_reserved_mount_paths_are_refused_as_the_checkpoint_path(path: str) -> None:
    message = errors(manifest(checkpoint={"path": path}))["spec.checkpoint.path"]
    assert "collides with" in message or "'..'" in message


@pytest.mark.parametrize("path", ["/checkpoints", "/tmp/ckpt", "/dev/shm/ckpt", "/mnt/etc/disttrain", "/runs"])
def test_other_paths_are_fine(path: str) -> None:
    assert load_job(manifest(checkpoint={"path": path})).spec.checkpoint.path == path


def test_the_checkpoint_volume_must_be_a_restricted_volume_type() -> None:
    host = errors(manifest(checkpoint={"volume": {"hostPath": {"path": "/data"}}}))
    assert "volume type hostPath is not allowed" in host["spec.checkpoint.volume.hostPath"]
    assert "persistentVolumeClaim" in host["spec.checkpoint.volume.hostPath"]
    assert "spec.checkpoint.volume.nfs" in errors(manifest(checkpoint={"volume": {"nfs": {"server": "s", "path": "/"}}}))
    two = errors(manifest(checkpoint={"volume": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}}))
    assert "exactly one volume type" in two["spec.checkpoint.volume"]
    named = errors(manifest(checkpoint={"volume": {"name": "x", "emptyDir": {}}}))
    assert "the operator names the volume" in named["spec.checkpoint.volume.name"]
    claim = {"persistentVolumeClaim": {"claimName": "checkpoints"}}
    assert load_job(manifest(checkpoint={"volume": claim})).spec.checkpoint.volume == claim


HOSTILE: dict[str, Any] = {
    "hostNetwork": True, "hostPID": True, "hostIPC": True, "serviceAccountName": "admin",
    "automountServiceAccountToken": True, "nodeName": "n1", "securityContext": {"runAsUser": 0},
    "initContainers": [{"name": "i", "image": "busybox"}], "dnsPolicy": "None",
    "volumes": [{"name": "host", "hostPath": {"path": "/"}}, {"name": "config", "emptyDir": {}},
                {"name": "nfs", "nfs": {"server": "s", "path": "/"}}],
    "volumeMounts": [{"name": "host", "mountPath": "/host", "mountPropagation": "Bidirectional"},
                     {"name": "checkpoints", "mountPath": "/elsewhere"},
                     {"name": "host", "mountPath": "/etc/disttrain/x"}],
    "containers": [{"name": "trainer", "securityContext": {"privileged": True}, "ports": [{"containerPort": 22,
                                                                                        "hostPort": 22}],
                    "resources": {"limits": {"cpu": "64"}}, "lifecycle": {}},
                   {"name": "side"}, {"image": "busybox"}],
    "annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined",
                    "seccomp.security.alpha.kubernetes.io/pod": "unconfined"},
    "labels": {"disttrain.dev/job-name": "other"},
    "env": [{"name": "1 bad", "value": "x"}],
}


def test_every_field_of_a_hostile_template_is_named() -> None:
    found = errors(manifest(**template(**HOSTILE)))
    t = "spec.workers.template"
    for key in ("hostNetwork", "hostPID", "hostIPC", "serviceAccountName", "automountServiceAccountToken",
                "nodeName", "securityContext", "initContainers", "dnsPolicy"):
        assert "not allowed in workers.template" in found[f"{t}.{key}"], key
        assert "restricted Pod Security" in found[f"{t}.{key}"]
    assert "hostPath is not allowed" in found[f"{t}.volumes[0].hostPath"]
    assert "the operator's volume" in found[f"{t}.volumes[1].name"]
    assert "nfs is not allowed" in found[f"{t}.volumes[2].nfs"]
    assert "not allowed in a volume mount" in found[f"{t}.volumeMounts[0].mountPropagation"]
    assert "the operator's volume" in found[f"{t}.volumeMounts[1].name"]
    assert "collides with /etc/disttrain" in found[f"{t}.volumeMounts[2].mountPath"]
    assert "security context" in found[f"{t}.containers[0].securityContext"]
    assert "not allowed" in found[f"{t}.containers[0].ports"]
    assert "spec.workers.resources" in found[f"{t}.containers[0].resources"]
    assert "not allowed" in found[f"{t}.containers[0].lifecycle"]
    assert "needs an image" in found[f"{t}.containers[1].image"]
    assert "needs a name" in found[f"{t}.containers[2].name"]
    assert "reserved" in found[f"{t}.annotations.container.apparmor.security.beta.kubernetes.io/trainer"]
    assert "reserved" in found[f"{t}.annotations.seccomp.security.alpha.kubernetes.io/pod"]
    assert "reserved" in found[f"{t}.labels.disttrain.dev/job-name"]
    assert "not a valid environment variable name" in found[f"{t}.env[0].name"]
    with pytest.raises(SpecError):  # the operator loads jobs with the same rules
        load_job(manifest(**template(**HOSTILE)))


def test_a_template_mount_may_not_shadow_the_checkpoint_path() -> None:
    t = {"volumes": [{"name": "data", "emptyDir": {}}], "volumeMounts": [{"name": "data", "mountPath": "/ckpt"}]}
    found = errors(manifest(checkpoint={"path": "/ckpt"}, **template(**t)))
    assert "already mounted by spec.checkpoint.path" in found["spec.workers.template.volumeMounts[0].mountPath"]
    missing = errors(manifest(**template(volumeMounts=[{"name": "nope", "mountPath": "/x"}])))
    assert "no volume named 'nope'" in missing["spec.workers.template.volumeMounts[0].name"]


def test_everything_the_allow_list_names_passes() -> None:
    allowed = {
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "TOKEN", "valueFrom": {
            "secretKeyRef": {"name": "s", "key": "k"}}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
                    {"name": "cfg", "configMap": {"name": "c"}}, {"name": "scratch", "emptyDir": {"medium": "Memory"}},
                    {"name": "creds", "secret": {"secretName": "s"}}, {"name": "vol", "ephemeral": {}},
                    {"name": "info", "downwardAPI": {"items": []}}, {"name": "p", "projected": {"sources": []}},
                    {"name": "csi", "csi": {"driver": "d"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True},
                         {"name": "scratch", "mountPath": "/dev/shm"}, {"name": "cfg", "mountPath": "/tmp/cfg"}],
        "nodeSelector": {"pool": "train"}, "affinity": {"nodeAffinity": {}},
        "tolerations": [{"key": "gpu", "operator": "Exists"}], "priorityClassName": "high",
        "annotations": {"team": "ml"}, "labels": {"team": "ml"}, "topologySpreadConstraints": [{"maxSkew": 1}],
        "imagePullSecrets": [{"name": "registry"}], "schedulerName": "volcano", "runtimeClassName": "nvidia",
        "containers": [{"name": "trainer", "image": "mine:1", "command": ["python"], "args": ["train.py"],
                        "workingDir": "/data", "envFrom": [{"configMapRef": {"name": "c"}}],
                        "volumeMounts": [{"name": "creds", "mountPath": "/creds", "readOnly": True}]},
                       {"name": "shipper", "image": "busybox", "command": ["sleep", "1"]}],
    }
    job = load_job(manifest(**template(**copy.deepcopy(allowed))))
    assert job.spec.workers.template == allowed
