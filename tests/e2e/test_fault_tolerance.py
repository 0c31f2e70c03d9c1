"""spec.faultTolerance on a real cluster: the job's lighthouse Deployment, and a replica pod deleted
mid-run. The job stays Running (same attempt, the other replica's pod untouched) at a smaller
quorum, the replacement pod recovers from the live peer and rejoins (Event ReplicaJoined), and the
job Succeeds with every replica's parameters identical (the last quorum's max difference is 0).

Cheap: two replicas on 500m, a digits MLP whose steps are paced (DISTTRAIN_FAULT_STEP_SLEEP_S) so
the deletion lands mid-run on a busy host. Each replica is one process (ddp), or two processes
sharding the model (HSDP: the pod's launcher spawns them, and the replacement pod's two processes
each recover their shards from the live pod's process of the same group rank).
"""

from __future__ import annotations

import uuid

import pytest

from .conftest import Kubectl, OperatorProcess, events, job_manifest  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("procs", [1, 2], ids=["ddp", "hsdp"])
def test_deleted_replica_pod_leaves_a_smaller_quorum_then_rejoins(kubectl: Kubectl, operator: OperatorProcess,
                                                                  namespace: str, procs: int) -> None:  # fmt: skip
    name = f"ft-{uuid.uuid4().hex[:5]}"
    # 800 steps paced at 0.15 s: at least 2 minutes, so that a replacement pod started on a busy
    # host (tens of seconds) rejoins before the survivor finishes alone (300 steps did not, once).
    obj = job_manifest(name, namespace, steps=800, faultTolerance={"minReplicas": 1, "heartbeatTimeoutSeconds": 3},
                       checkpoint={"intervalSteps": 100, "keep": 2},  # on the claim the operator makes
                       data={"name": "digits", "batchSize": 32 * 2 * procs})  # fmt: skip
    if procs > 1:
        obj["spec"]["workers"]["procsPerWorker"] = procs
        # Each process imports torch and torchft (~400 MiB): 768Mi OOM-kills one of two.
        obj["spec"]["workers"]["resources"]["memory"] = "1536Mi"
        obj["spec"]["parallelism"] = {"dataStrategy": "fsdp"}
    obj["spec"]["workers"]["template"] = {"env": [{"name": "DISTTRAIN_FAULT_STEP_SLEEP_S", "value": "0.15"}]}
    kubectl.apply(obj)
    kubectl.wait_for("the lighthouse Deployment", lambda: any(
        d["metadata"]["name"] == f"{name}-lighthouse" for d in kubectl.json(
            "get", "deployments", "-n", namespace, "-l", f"disttrain.dev/job-name={name}")["items"]), timeout=120)  # fmt: skip
    kubectl.wait_phase(namespace, name, ("Running",), timeout=300)

    def status() -> dict:
        return kubectl.job(namespace, name).get("status") or {}

    kubectl.wait_for("both replicas in the quorum at step 30", lambda: int(status().get("step") or 0) >= 30
                     and (status().get("replicaGroups") or {}).get("quorum") == 2, timeout=300, interval=1.0)  # fmt: skip
    survivor = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(namespace, name)
                if p["metadata"]["name"] == f"{name}-worker-0"}  # fmt: skip
    kubectl.run("delete", "pod", f"{name}-worker-1", "-n", namespace, "--wait=false")
    kubectl.wait_for("ReplicaLost", lambda: any(e["reason"] == "ReplicaLost" for e in events(kubectl, namespace, name)),
                     timeout=120, interval=1.0)  # fmt: skip
    st = status()
    assert st["phase"] == "Running" and st["attempt"] == 0, st
    kubectl.wait_for("ReplicaJoined", lambda: any(e["reason"] == "ReplicaJoined"
                                                  for e in events(kubectl, namespace, name)), timeout=300, interval=1.0)  # fmt: skip
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=400)
    st = job["status"]
    assert st["phase"] == "Succeeded", st
    assert st["attempt"] == 0 and st["restarts"] == 0 and st["disruptions"] == 1, st  # no gang restart
    groups = st["replicaGroups"]
    assert groups["lost"] == 1 and groups["joined"] >= 1, groups
    assert st["result"]["replicaMaxAbsDiff"] == 0.0, st["result"]
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(namespace, name)}
    assert all(now.get(pod) in (uid, None) for pod, uid in survivor.items())  # the survivor was never replaced
    kubectl.wait_for("the lighthouse deleted with the finished job", lambda: not any(
        d["metadata"]["name"] == f"{name}-lighthouse" and not d["metadata"].get("deletionTimestamp")
        for d in kubectl.json("get", "deployments", "-n", namespace, "-l", f"disttrain.dev/job-name={name}")["items"]),
        timeout=60)  # fmt: skip
