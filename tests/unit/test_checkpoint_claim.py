"""Checkpoints that survive a gang restart by default: the claim the operator builds for a job
without spec.checkpoint.volume (size, access modes, owner, StorageClass), the pods that mount
it, the conditions of decide() (CheckpointsEphemeral, CheckpointClaimPending) and their
Events, and `disttrain validate`'s warning."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from disttrain_api import checkpoint_storage as storage
from disttrain_api import constants as c
from disttrain_api import model as api
from disttrain_cli.validate_cmd import validate_text
from disttrain_operator.decide import decide, needs_recheck
from disttrain_operator.decision import Observed
from disttrain_operator.observe import ClaimView, PodView, claim_view
from disttrain_operator.settings import from_env
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext
from disttrain_trainer import models

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]
CLAIM = "job1-checkpoints"
RUNNING_STATUS = {
    "phase": "Running", "attempt": 0, "replicas": 2, "restarts": 0, "lastSpecReplicas": 2, "observedGeneration": 1,
    "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"},
                   {"type": "Running", "status": "True", "reason": "GangRunning"}],
}


def spec(**over: Any) -> api.JobSpec:
    base: dict[str, Any] = {"mode": "data", "workers": {"replicas": 2}}
    base.update(over)
    return api.parse_spec(base)


def ctx(**over: Any) -> BuildContext:
    values: dict[str, Any] = {"name": "job1", "namespace": "ns1", "uid": "uid-1", "image": "img:1", "replicas": 2}
    values.update(over)
    return BuildContext(**values)


def checkpoint_volumes(children: Any) -> list[dict[str, Any]]:
    pod_specs = [p["spec"] for p in children.pods] + [d["spec"]["template"]["spec"] for d in children.deployments]
    return [v for s in pod_specs for v in s["volumes"] if v["name"] == "checkpoints"]


# ------------------------------------------------------------------------- the claim


def test_a_job_without_a_volume_gets_one_claim_owned_by_it_that_every_pod_mounts() -> None:
    children = build_children(spec(), ctx())
    (claim,) = children.claims
    assert claim == {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": "ns1", "labels": {c.LABEL_JOB: "job1"},
                     "ownerReferences": [{"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
                                          "name": "job1", "uid": "uid-1", "controller": True,
                                          "blockOwnerDeletion": True}]},
        # Two pods that may run on two nodes share it; no class named: the cluster's default.
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    assert checkpoint_volumes(children) == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}] * 2
    # Created before the pods that mount it.
    everything = children.all()
    assert everything.index(claim) < min(everything.index(p) for p in children.pods)


@pytest.mark.parametrize("mode", ["federated", "paramserver", "pipeline"])
def test_servers_and_clients_share_the_claim(mode: str) -> None:
    children = build_children(spec(mode=mode), ctx())
    (claim,) = children.claims
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = checkpoint_volumes(children)
    assert volumes and all(v == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}} for v in volumes)


def test_the_operators_storage_class_and_the_specs_size_and_retain() -> None:
    children = build_children(spec(checkpoint={"size": "50Gi", "retain": True}), ctx(checkpoint_storage_class="nfs"))
    (claim,) = children.claims
    assert claim["spec"]["storageClassName"] == "nfs"
    assert claim["spec"]["resources"] == {"requests": {"storage": "50Gi"}}
    # Retained: no owner, so the garbage collector keeps it when the job goes; the label names the job.
    assert "ownerReferences" not in claim["metadata"] and claim["metadata"]["labels"] == {c.LABEL_JOB: "job1"}


def test_one_pod_asks_read_write_once_and_a_gang_that_may_grow_read_write_many() -> None:
    one = spec(workers={"replicas": 1}, data={"batchSize": 64})
    assert build_children(one, ctx(replicas=1)).claims[0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    grows = spec(workers={"replicas": 1}, elastic={"minReplicas": 1, "maxReplicas": 2})
    assert build_children(grows, ctx(replicas=1)).claims[0]["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("checkpoint", [
    {"volume": {"persistentVolumeClaim": {"claimName": "mine"}}},
    {"volume": {"emptyDir": {}}},
    {"uri": "s3://bucket/ckpt"},
], ids=["own-claim", "emptyDir", "object-store"])
def test_no_claim_when_the_spec_says_where_checkpoints_go(checkpoint: dict[str, Any]) -> None:
    children = build_children(spec(checkpoint=checkpoint), ctx())
    assert children.claims == []
    want = dict(checkpoint.get("volume") or {"emptyDir": {}})  # object storage: the volume is staging
    assert checkpoint_volumes(children) == [{"name": "checkpoints", **want}] * 2


@pytest.mark.parametrize(("model", "data", "build"), [
    ({"name": "mlp", "hidden": 128, "layers": 2}, {"name": "digits"}, lambda: models.MLP(64, 128, 2, 10, 0.0, "none")),
    ({"name": "cnn", "hidden": 32, "layers": 3}, {"name": "digits"}, lambda: models.CNN(8, 32, 3, 10, 0.0, "none")),
    ({"name": "gpt", "hidden": 64, "layers": 2, "blockSize": 32}, {"path": "/d", "format": "tokens", "vocabSize": 500},
     lambda: models.GPT(500, 32, 64, 2, 4, 0.0, "none")),
], ids=["mlp", "cnn", "gpt"])
def test_the_size_estimate_counts_the_built_in_models_parameters(model: dict[str, Any], data: dict[str, Any],
                                                                 build: Any) -> None:
    s = spec(model=model, data={**data, "batchSize": 64})
    built: torch.nn.Module = build()
    assert storage.estimated_parameters(s) == sum(p.numel() for p in built.parameters())


def test_the_default_size_grows_with_the_model_and_keep() -> None:
    small = spec()
    assert storage.claim_size(small) == "1Gi"  # the digits MLP: 0.1 MB a checkpoint
    gpt2 = spec(model={"name": "gpt", "hidden": 768, "layers": 12, "heads": 12, "blockSize": 1024},
                data={"path": "/data/owt", "format": "tokens", "vocabSize": 50304}, optimizer={"name": "adamw"},
                checkpoint={"keep": 3})
    params = storage.estimated_parameters(gpt2)
    assert params == 163_109_376  # GPT-2 small's 124M with its own (untied) output head
    # weights + 2 Adam moments in fp32 = 1.96 GB; (3 kept + 2) x that x 2 headroom = 19.6 GB = 18.2 GiB -> 19Gi
    assert storage.claim_size(gpt2) == "19Gi"
    assert storage.claim_size(spec(model={"name": "mypkg.models:build"})) == f"{storage.UNKNOWN_MODEL_SIZE_GI}Gi"
    assert storage.claim_size(spec(checkpoint={"size": "3Ti"})) == "3Ti"


# --------------------------------------------------------------------------- decide()


def pod(index: int, phase: str = "Pending", **kw: Any) -> PodView:
    values: dict[str, Any] = {"name": f"j-worker-{index}", "role": "worker", "index": index, "attempt": 0,
                              "phase": phase, "scheduled": phase != "Pending"}
    values.update(kw)
    return PodView(**values)


def obs(status: dict[str, Any] | None = None, pods: list[PodView] | None = None, **kw: Any) -> Observed:
    values: dict[str, Any] = {"generation": 1, "spec": spec(), "status": status or {}, "pods": pods or [], "now": NOW}
    values.update(kw)
    values.setdefault("accepted", values["spec"] if status else None)
    return Observed(**values)


def cond(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((x for x in status["conditions"] if x["type"] == type_), None)


def test_an_emptydir_asked_for_is_a_condition_and_one_warning_event() -> None:
    ephemeral = spec(checkpoint={"volume": {"emptyDir": {}}})
    plan = decide(obs(spec=ephemeral))
    found = cond(plan.status, "CheckpointsEphemeral")
    assert found is not None and found["status"] == "True" and found["reason"] == "EphemeralVolume"
    assert "step 0" in found["message"] and "persistentVolumeClaim" in found["message"]
    assert [(t, r) for t, r, _ in plan.events if r == "EphemeralVolume"] == [("Warning", "EphemeralVolume")]
    # The next decisions keep it without another Event.
    again = decide(obs(plan.status, [pod(0, "Running"), pod(1, "Running")], spec=ephemeral))
    assert cond(again.status, "CheckpointsEphemeral")["status"] == "True"  # type: ignore[index]
    assert not [e for e in again.events if e[1] == "EphemeralVolume"]
    # The default (a claim): no such condition at all; an edit away from emptyDir clears it.
    assert cond(decide(obs()).status, "CheckpointsEphemeral") is None
    fixed = decide(obs(again.status, [pod(0, "Running"), pod(1, "Running")], generation=2))
    assert cond(fixed.status, "CheckpointsEphemeral")["status"] == "False"  # type: ignore[index]


UNBOUND = "0/2 nodes are available: 2 pod has unbound immediate PersistentVolumeClaims."


def claim(phase: str = "Pending", age_s: float = 5.0) -> ClaimView:
    return ClaimView(name=CLAIM, phase=phase, age_s=age_s, access_modes=("ReadWriteMany",), size="1Gi")


def test_a_young_pending_claim_is_waited_for_without_calling_the_pods_unschedulable() -> None:
    st = {**RUNNING_STATUS, "phase": "Pending",
          "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"}]}
    elastic = spec(elastic={"minReplicas": 1, "maxReplicas": 2, "scheduleTimeoutSeconds": 5})
    pods = [pod(0, unschedulable_message=UNBOUND, age_s=60), pod(1, unschedulable_message=UNBOUND, age_s=60)]
    o = obs(st, pods, spec=elastic, claim=claim(age_s=60.0), claim_pending_after_s=120.0)
    plan = decide(o)
    assert plan.status["phase"] == "Pending" and f"waiting for PersistentVolumeClaim {CLAIM}" in plan.status["message"]
    assert cond(plan.status, "Running") is None and cond(plan.status, "CheckpointClaimPending") is None
    assert not plan.events and not plan.delete_pods and plan.status["attempt"] == 0  # no elastic shrink
    assert needs_recheck(o, plan)  # the clock decides when it has waited too long


def test_a_claim_pending_too_long_gets_a_condition_and_a_warning_naming_the_causes() -> None:
    st = {**RUNNING_STATUS, "phase": "Pending",
          "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"}]}
    pods = [pod(0, unschedulable_message=UNBOUND), pod(1, unschedulable_message=UNBOUND)]
    plan = decide(obs(st, pods, claim=claim(age_s=121.0), claim_pending_after_s=120.0))
    found = cond(plan.status, "CheckpointClaimPending")
    assert found is not None and found["status"] == "True" and found["reason"] == "ClaimPending"
    for words in ("ReadWriteMany", "default StorageClass", "checkpoints.storageClass", f"kubectl describe pvc {CLAIM}"):
        assert words in found["message"]
    assert plan.status["message"] == found["message"]
    assert [(t, r) for t, r, _ in plan.events] == [("Warning", "ClaimPending")]
    # Still pending: the same condition, no second Event, no status change to write.
    again = decide(obs(plan.status, pods, claim=claim(age_s=150.0), claim_pending_after_s=120.0))
    assert not again.events and again.status == plan.status
    # Bound at last: the condition turns False, the pods are no longer waiting on it.
    bound = decide(obs(again.status, [pod(0), pod(1)], claim=claim("Bound", 160.0)))
    assert cond(bound.status, "CheckpointClaimPending")["status"] == "False"  # type: ignore[index]
    assert "PersistentVolumeClaim" not in bound.status["message"]


def test_claim_view_reads_what_the_message_names() -> None:
    live = {"metadata": {"name": CLAIM, "creationTimestamp": "2026-01-01T11:58:00Z"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs",
                     "resources": {"requests": {"storage": "2Gi"}}},
            "status": {"phase": "Pending"}}
    assert claim_view(live, NOW) == ClaimView(name=CLAIM, phase="Pending", age_s=120.0, storage_class="nfs",
                                              access_modes=("ReadWriteMany",), size="2Gi")


# ------------------------------------------------------------- settings and validate


def test_the_storage_class_setting_comes_from_the_environment() -> None:
    assert from_env({}).checkpoint_storage_class == ""
    assert from_env({"DISTTRAIN_OPERATOR_CHECKPOINT_STORAGE_CLASS": "cephfs"}).checkpoint_storage_class == "cephfs"
    assert from_env({}, checkpoint_storage_class="efs").checkpoint_storage_class == "efs"


JOB = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: ok}}
spec: {{mode: data, checkpoint: {checkpoint}}}
"""


@pytest.mark.parametrize("kind", ["emptyDir", "ephemeral"])
def test_validate_warns_about_checkpoints_that_die_with_the_pod(kind: str) -> None:
    volume = "{emptyDir: {}}" if kind == "emptyDir" else (
        "{ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}}")
    out: list[str] = []
    problems: list[str] = []
    warnings: list[str] = []
    validate_text(JOB.format(checkpoint=f"{{volume: {volume}}}"), "job.yaml", out, problems, warnings)
    assert not problems and len(out) == 1 and out[0].startswith("job.yaml: valid")
    (line,) = warnings
    assert line.startswith(f"job.yaml: warning: spec.checkpoint.volume.{kind}: an {kind} volume dies with its pod")
    assert "step 0" in line
    for fine in ("{}", "{volume: {persistentVolumeClaim: {claimName: x}}}", "{uri: 's3://bucket/ckpt'}"):
        warnings = []
        validate_text(JOB.format(checkpoint=fine), "job.yaml", [], problems, warnings)
        assert warnings == [] and problems == []


def test_the_data_parallel_example_uses_the_default_claim() -> None:
    import yaml

    example = yaml.safe_load((ROOT / "manifests" / "examples" / "data-parallel.yaml").read_text())
    s = api.parse_spec(example["spec"])
    assert storage.uses_default_claim(s) and storage.claim_size(s) == "1Gi"
    assert storage.access_modes(s) == ["ReadWriteMany"]


def test_the_pending_message_names_the_causes_that_fit_the_claim() -> None:
    from disttrain_operator.checkpoint_status import pending_message

    shared = pending_message(ClaimView(name=CLAIM, phase="Pending", access_modes=("ReadWriteMany",), size="1Gi"), 120)
    assert "no StorageClass is the cluster's default" in shared and "offers only ReadWriteOnce" in shared
    one = pending_message(ClaimView(name=CLAIM, phase="Pending", storage_class="fast", access_modes=("ReadWriteOnce",),
                                    size="1Gi"), 120)
    assert "StorageClass fast does not exist or has no working provisioner" in one and "ReadWriteMany" not in one
