"""The federated example on a cluster: clients reach the aggregator by its Service name over
TLS with per-client credentials (the operator's Secrets), the job Succeeds with >= 0.90 test
accuracy; killing the aggregator pod resumes from its checkpointed round; killing a client
pod leaves the rounds going (no gang restart in this mode).

The operator creates the two Secrets (TLS key pair, identity credentials); the aggregator
checkpoints to a volume that outlives its pod (the namespace's checkpoint claim), which the client
pods mount read-only: a client that tries to plant a checkpoint for the aggregator to resume from
(a pickle payload, a forged meta.json and fence claim) is refused by the file system. That such a
checkpoint, were it there, would be neither run nor resumed from is tests/dist/
test_federated_aggregator_restart.py's (a planted one, read by a restarted aggregator).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import DISTTRAIN  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _manifest(name: str, ns: str, cpu: str = "750m", **fed: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "manifests" / "examples" / "federated.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": ns}
    obj["spec"]["workers"]["resources"]["cpu"] = cpu
    obj["spec"]["federated"].update(fed)
    return obj


# Run in a client pod: plant step-99999999 (a pickle that would create a file when unpickled), its
# meta.json and a fence claim in the aggregator's checkpoint directory; print what the file system said.
PLANT = """
import errno, json, os, pickle, sys
root = os.path.join(sys.argv[1], sys.argv[2])
class Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/pwned",))
out = {}
for name, body in (("step-99999999/state.pt", pickle.dumps({"model": Payload()})),
                   ("step-99999999/meta.json", json.dumps({"step": 99999999, "format": 2}).encode()),
                   (".fence/999999999999", json.dumps({"attempt": 0, "published": ["step-99999999"]}).encode())):
    path = os.path.join(root, name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
        out[name] = "written"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def _pods(kubectl: Any, ns: str, name: str, role: str) -> list[dict[str, Any]]:
    return [p for p in kubectl.pods(ns, name)
            if p["metadata"]["labels"].get("disttrain.dev/role") == role]  # fmt: skip


def test_federated_example_succeeds_on_the_cluster(kubectl: Any, operator: Any, namespace: str, tmp_path: Path) -> None:
    # `disttrain logs` finds the aggregator (a Deployment's pod) from the job's labels and follows
    # it from before it exists until the job ends (its Deployment is deleted then). The job starts
    # suspended and is resumed once the follow looks for the pod: a run of ~15 s could otherwise
    # be over (its pod gone) before a CLI that starts slowly on a busy host takes its first look.
    obj = _manifest("fed", namespace)
    obj["spec"]["runPolicy"] = {**obj["spec"].get("runPolicy", {}), "suspend": True}
    kubectl.apply(obj)
    log, err = tmp_path / "aggregator.log", tmp_path / "follow.err"
    with open(log, "wb") as out, open(err, "wb") as errors:
        follow = subprocess.Popen([str(DISTTRAIN), "logs", "fed", "-n", namespace, "--role", "aggregator", "-f"],
                                  env={**os.environ, "KUBECONFIG": kubectl.kubeconfig}, stdout=out,
                                  stderr=errors)  # fmt: skip
    try:
        kubectl.wait_for("the follow to wait for the aggregator's pod",
                         lambda: "waiting for the aggregator's pod to start" in err.read_text(), timeout=180)  # fmt: skip
        kubectl.run("patch", "dtj", "fed", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": False}}}))  # fmt: skip
        job = kubectl.wait_phase(namespace, "fed", ("Succeeded", "Failed"), timeout=900)
        assert follow.wait(timeout=60) == 0, err.read_text()
    finally:
        if follow.poll() is None:
            follow.kill()
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert re.search(r"^aggregator: round 30/30 done in ", log.read_text(), re.M), log.read_text()[-2000:]
    assert job["status"]["result"]["steps"] == 30 and job["status"]["step"] == 30  # the step column counts rounds
    assert job["status"]["result"]["testAccuracy"] >= 0.90
    assert job["status"]["restarts"] == 0
    secrets = kubectl.run("get", "secrets", "-n", namespace, "-o", "name").stdout.split()
    minted = job["status"]["secrets"]  # created by the operator, recorded once the API server had them
    assert minted["tls"].startswith("fed-tls-") and minted["identity"].startswith("fed-identity-"), minted
    assert {f"secret/{minted['tls']}", f"secret/{minted['identity']}"} <= set(secrets)


def test_killed_aggregator_resumes_and_killed_client_is_replaced(kubectl: Any, operator: Any, namespace: str) -> None:
    # 60 rounds: an idle machine runs a round in well under a second, and the kill below lands a
    # few seconds after status.step (scraped every poll interval) shows round 3; with 20 the run
    # could end first, and nothing would have been killed mid-run.
    # 400m: a force-deleted pod's container still counts against its node's CPU at the kubelet
    # until it has stopped, so its replacement (and the aggregator's) can land on a node that still
    # runs the old ones; at 750m the kubelet could reject it (OutOfcpu), a real failure the operator
    # counts as a restart. Four pods at 400m fit a node's 2 CPUs.
    kubectl.apply(_manifest("fedkill", namespace, cpu="400m", rounds=60, roundTimeoutSeconds=20))
    # Round 4 done: round 3's checkpoint is written (each round's is saved before the next starts).
    kubectl.wait_for("round 4", lambda: (kubectl.job(namespace, "fedkill").get("status") or {}).get("step", 0) >= 4,
                     timeout=600)  # fmt: skip
    client = _pods(kubectl, namespace, "fedkill", "client")[0]
    mount, = (m for m in client["spec"]["containers"][0]["volumeMounts"] if m["name"] == "checkpoints")
    assert mount.get("readOnly") is True, mount
    got = kubectl.run("exec", "-n", namespace, client["metadata"]["name"], "-c", "trainer", "--", "python", "-c",
                      PLANT, mount["mountPath"], "fedkill", timeout=120)  # fmt: skip
    planted = json.loads(got.stdout.strip().splitlines()[-1])
    # Read-only: nothing lands where the aggregator resumes from.
    assert planted == dict.fromkeys(planted, "EROFS") and len(planted) == 3, planted
    agg = _pods(kubectl, namespace, "fedkill", "aggregator")[0]["metadata"]["name"]
    kubectl.run("delete", "pod", agg, "-n", namespace, "--grace-period=0", "--force")
    client = _pods(kubectl, namespace, "fedkill", "client")[0]["metadata"]["name"]
    kubectl.run("delete", "pod", client, "-n", namespace, "--grace-period=0", "--force")
    job = kubectl.wait_phase(namespace, "fedkill", ("Succeeded", "Failed"), timeout=900)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    # No gang restart in this mode, and no pod failed: the deleted client was gone, not failed.
    replaced = [e["message"] for e in kubectl.json("get", "events", "-n", namespace, "--field-selector",
                                                   "involvedObject.name=fedkill")["items"]
                if e["reason"] == "WorkerReplaced"]  # fmt: skip
    assert job["status"]["restarts"] == 0, replaced
    result = job["status"]["result"]
    # (a null resumedFromStep is pruned from the status: absent means the aggregator never resumed)
    assert (result.get("resumedFromStep") or 0) >= 3, f"the aggregator did not resume mid-run: {result}"
    assert result["steps"] == 60
