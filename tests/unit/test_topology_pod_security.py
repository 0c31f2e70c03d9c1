"""Worker pods meet the restricted Pod Security Standard whatever workers.template says, and
every name a job derives stays a valid label.

`restricted_violations` is written from the standard's table (kubernetes.io/docs/concepts/
security/pod-security-standards, "Restricted"), independently of the builder's own
constants, so a builder change that loosens a pod fails here."""

from __future__ import annotations

import re
from typing import Any

import pytest
from disttrain_api import constants as c
from disttrain_api import model as api
from disttrain_api.pod_rules import RESERVED_VOLUMES, template_errors
from disttrain_operator.topology import BUILDERS, build_children
from disttrain_operator.topology.common import BuildContext

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range"}
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    spec, meta = pod["spec"], pod.get("metadata") or {}
    found = [f"spec.{f}" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    psc = spec.get("securityContext") or {}
    if (psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        found.append("spec.securityContext.seccompProfile")
    if psc.get("runAsUser") == 0:
        found.append("spec.securityContext.runAsUser")
    if any(s.get("name") not in SAFE_SYSCTLS for s in psc.get("sysctls") or []):
        found.append("spec.securityContext.sysctls")
    se = psc.get("seLinuxOptions") or {}
    if se.get("user") or se.get("role"):
        found.append("spec.securityContext.seLinuxOptions")
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {v['name']}: {sorted(kinds)}")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and value != "runtime/default" \
                and not value.startswith("localhost/"):
            found.append(f"annotation {key}")
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or []),
                  *(spec.get("ephemeralContainers") or [])]
    for ctr in containers:
        at = f"container {ctr['name']}"
        sc = ctr.get("securityContext") or {}
        if sc.get("privileged"):
            found.append(f"{at}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{at}: allowPrivilegeEscalation")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{at}: capabilities")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            found.append(f"{at}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            found.append(f"{at}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{at}: seccompProfile")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"{at}: procMount")
        if any(p.get("hostPort") for p in ctr.get("ports") or []):
            found.append(f"{at}: hostPort")
        if any(m.get("mountPropagation") not in (None, "None") for m in ctr.get("volumeMounts") or []):
            found.append(f"{at}: mountPropagation")
    return found


def pods_of(mode: str, template: dict[str, Any], **spec: Any) -> list[dict[str, Any]]:
    """Every pod a job of `mode` makes: its gang pods and its server Deployments' pods."""
    s = api.parse_spec({"mode": mode, "workers": {"replicas": 2, "template": template}, **spec})
    children = build_children(s, BuildContext(name="job1", namespace="ns1", uid="uid-1", image="img:1", replicas=2))
    servers = [{"metadata": d["spec"]["template"]["metadata"], "spec": d["spec"]["template"]["spec"]}
               for d in children.deployments]
    return [*children.pods, *servers]


HOSTILE: dict[str, Any] = {
    "hostNetwork": True, "hostPID": True, "hostIPC": True,
    "serviceAccountName": "cluster-admin-sa", "automountServiceAccountToken": True, "nodeName": "node-1",
    "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
    "initContainers": [{"name": "init", "image": "busybox", "securityContext": {"privileged": True}}],
    "volumes": [
        {"name": "host", "hostPath": {"path": "/"}},
        {"name": "config", "hostPath": {"path": "/etc"}},  # replacing the operator's own volume
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
    ],
    "volumeMounts": [{"name": "host", "mountPath": "/host"},
                     {"name": "data", "mountPath": "/data", "mountPropagation": "Bidirectional"}],
    "containers": [
        {"name": "trainer", "command": ["python", "train.py"], "image": "mine:1",
         "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0,
                             "allowPrivilegeEscalation": True, "readOnlyRootFilesystem": False},
         "ports": [{"containerPort": 22, "hostPort": 22}], "resources": {"limits": {"cpu": "64"}}},
        {"name": "shipper", "image": "busybox", "securityContext": {"privileged": True, "runAsUser": 0}},
    ],
    "annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined",
                    "seccomp.security.alpha.kubernetes.io/pod": "unconfined", "team": "ml"},
    "labels": {c.LABEL_JOB: "someone-else", "team": "ml"},
    "nodeSelector": {"pool": "train"},
    "tolerations": [{"key": "dedicated", "operator": "Exists"}],
}


@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_every_pod_is_restricted_with_no_template(mode: str) -> None:
    for pod in pods_of(mode, {}):
        assert restricted_violations(pod) == []


@pytest.mark.parametrize("mode", ["data", "federated", "paramserver"])
def test_a_hostile_template_still_yields_restricted_pods(mode: str) -> None:
    for pod in pods_of(mode, HOSTILE):
        assert restricted_violations(pod) == [], pod
        spec = pod["spec"]
        for forbidden in ("serviceAccountName", "nodeName", "initContainers", "hostNetwork"):
            assert forbidden not in spec
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] == 10001 and "sysctls" not in spec["securityContext"]
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "host" not in volumes and volumes["config"]["configMap"]["name"] == "job1-config"
        assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
        trainer, shipper = spec["containers"]
        # What the allow-list admits is applied: the user's image and command, a PVC mount,
        # scheduling hints, plain labels and annotations.
        assert trainer["image"] == "mine:1" and trainer["command"] == ["python", "train.py"]
        mounts = {m["mountPath"]: m for m in trainer["volumeMounts"]}
        assert mounts["/data"] == {"name": "data", "mountPath": "/data"} and "/host" not in mounts
        assert trainer["resources"]["limits"]["cpu"] == "1"  # spec.workers.resources, not the template's
        assert "hostPort" not in str(trainer["ports"])
        assert trainer["securityContext"]["readOnlyRootFilesystem"] is True
        assert shipper["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["nodeSelector"] == {"pool": "train"}
        assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["labels"][c.LABEL_JOB] == "job1"
        assert pod["metadata"]["annotations"].get("team") == "ml"
        assert not any("apparmor" in k or "seccomp" in k for k in pod["metadata"]["annotations"])


def test_the_root_filesystem_is_read_only_and_tmp_and_home_are_writable() -> None:
    (pod, _) = pods_of("data", {})
    (trainer,) = pod["spec"]["containers"]
    assert trainer["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in trainer["volumeMounts"]
                if not m.get("readOnly") and any(v["name"] == m["name"] and "emptyDir" in v
                                                 for v in pod["spec"]["volumes"])}
    assert {"/tmp", c.RUN_MOUNT_DIR} <= writable
    env = {e["name"]: e["value"] for e in trainer["env"]}
    for var in ("HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert env[var].startswith("/tmp"), var
    # The user's value wins.
    (pod, _) = pods_of("data", {"env": [{"name": "HOME", "value": "/data/home"}]})
    assert {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}["HOME"] == "/data/home"


@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_every_derived_name_of_the_longest_job_name_is_a_valid_label(mode: str) -> None:
    name = "j" + "x" * (api.MAX_JOB_NAME - 1)
    extra: dict[str, Any] = {"paramServer": {"shards": 64}} if mode == "paramserver" else {}
    s = api.parse_spec({"mode": mode, "workers": {"replicas": 1024}, **extra})
    children = build_children(s, BuildContext(name=name, namespace="n" * 63, uid="0123456789abcdef",
                                              image="img", replicas=1024))
    for obj in children.all():
        meta = obj["metadata"]
        # DNS subdomains (253): ConfigMaps, Secrets, NetworkPolicies; the rest must also be labels.
        limit = 253 if obj["kind"] in ("ConfigMap", "Secret", "NetworkPolicy") else 63
        assert len(meta["name"]) <= limit, meta["name"]
        if obj["kind"] == "Service":
            assert DNS_1035.match(meta["name"]), meta["name"]
        for value in meta["labels"].values():
            assert len(value) <= 63
    for pod in children.pods:
        assert len(pod["spec"]["hostname"]) <= 63 and DNS_1035.match(pod["spec"]["hostname"])



@pytest.mark.parametrize("mode", sorted(BUILDERS))
def test_every_volume_the_operator_adds_is_reserved_from_templates(mode: str) -> None:
    """A template volume named like one of the operator's would replace it or be refused by the API
    server as a duplicate: validation must refuse exactly those names, the Secrets' volumes too."""
    added = {v["name"] for pod in pods_of(mode, {}, data={"volume": {"persistentVolumeClaim": {"claimName": "d"}}})
             for v in pod["spec"]["volumes"]}  # fmt: skip
    assert added <= set(RESERVED_VOLUMES), added - set(RESERVED_VOLUMES)
    for name in sorted(added):
        template = {"volumes": [{"name": name, "configMap": {"name": "users-own"}}]}
        spec = api.parse_spec({"mode": mode, "workers": {"replicas": 2, "template": template}})
        errors = [e.message for e in template_errors(spec.workers.template, spec.checkpoint.path)]
        assert any("the operator's volume" in e for e in errors), (name, errors)
        assert not [v for pod in pods_of(mode, template) for v in pod["spec"]["volumes"]
                    if (v.get("configMap") or {}).get("name") == "users-own"]  # fmt: skip
