"""Data and checkpoints on object storage, on the cluster: a job reads its token files from an
S3-compatible server (moto, started on this machine at the nodes' bridge address so pods reach
it, every request signed with a key the pods get from a Secret) and writes its checkpoints there
(spec.checkpoint.uri: the pods keep only an emptyDir). A twin is SIGKILLed once mid-run; its new
gang starts on empty pods, resumes from the newest committed checkpoint in the bucket, Succeeds,
and ends at exactly the parameters of the uninterrupted job.

The server listens on the local cluster's bridge (hack/localcluster/config.py BRIDGE_IP), and
the kill needs the node's runtime: the local cluster only.
"""

from __future__ import annotations

import io
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import Kubectl, OperatorProcess  # type: ignore[import-not-found]
from .test_chaos import kill_when_running, wait_restarts  # type: ignore[import-not-found]
from .test_user_image import user_job, write_corpus  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(900)  # moto serves every ranged read single-threaded: 253 s on a loaded 2-core machine
SECRET = "s3-credentials"
# The kill follows the commit of step KILL_AFTER within seconds; STEPS leaves the killed gang over
# a hundred steps to go then; the test fails, saying so, should the kill ever come after the last.
STEPS, INTERVAL, KILL_AFTER = 160, 20, 40
MARKER = re.compile(r"/step-(\d{8,})\.claim-(\d+)\.committed$")  # the commit marker of the writer's claim


@pytest.fixture
def store(request: pytest.FixtureRequest, s3_servers: Any) -> Any:
    request.getfixturevalue("local_cluster")  # puts hack/ on sys.path; the bridge exists while it is up
    from localcluster.config import BRIDGE_IP  # type: ignore[import-not-found]

    return s3_servers(BRIDGE_IP)


def committed(store: Any, bucket: str, ns: str, job: str) -> dict[int, int]:
    """Step -> the claim whose commit marker is in the bucket under the job's prefix <uri>/<namespace>/<job>
    (a checkpoint without one does not exist)."""
    pages = store.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"runs/{ns}/{job}/")
    return {int(m.group(1)): int(m.group(2)) for page in pages for o in page.get("Contents", [])
            if (m := MARKER.search("/" + o["Key"]))}  # fmt: skip


def committed_steps(store: Any, bucket: str, ns: str, job: str) -> list[int]:
    return sorted(committed(store, bucket, ns, job))


def s3_job(name: str, ns: str, store: Any, bucket: str) -> dict[str, Any]:
    obj = user_job(name, ns)
    spec = obj["spec"]
    spec["training"]["steps"] = STEPS
    del spec["data"]["volume"]
    spec["data"]["path"] = f"s3://{bucket}/corpus"
    spec["checkpoint"] = {"uri": f"s3://{bucket}/runs", "intervalSteps": INTERVAL, "keep": 2}
    spec["objectStore"] = {"endpoint": store.url, "region": "us-east-1", "credentialsSecret": SECRET}
    return obj


def final_parameters(store: Any, bucket: str, ns: str, job: str) -> dict[str, torch.Tensor]:
    claim = committed(store, bucket, ns, job)[STEPS]
    key = f"runs/{ns}/{job}/step-{STEPS:08d}/claim-{claim}/state.pt"
    body = store.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    state = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def test_token_data_and_checkpoints_on_s3_resume_exactly_after_a_kill(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, namespace: str, store: Any,
) -> None:
    cluster = request.getfixturevalue("local_cluster")
    bucket = store.bucket("e2e")
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(Path(tmp) / "corpus")
        for f in ("train.bin", "val.bin"):
            store.client().upload_file(str(Path(tmp) / "corpus" / f), bucket, f"corpus/{f}")
    kubectl.run("create", "secret", "generic", SECRET, "-n", namespace,
                f"--from-literal=AWS_ACCESS_KEY_ID={store.key_id}",
                f"--from-literal=AWS_SECRET_ACCESS_KEY={store.secret}")  # fmt: skip
    suffix = uuid.uuid4().hex[:5]
    reference, killed = names = (f"s3-ref-{suffix}", f"s3-{suffix}")
    for name in names:
        kubectl.apply(s3_job(name, namespace, store, bucket))

    def checkpointed() -> int:
        status = kubectl.job(namespace, killed).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            raise AssertionError(f"{killed} finished before the kill: {status}")
        return max([s for s in committed_steps(store, bucket, namespace, killed) if s >= KILL_AFTER], default=0)

    kubectl.wait_for(f"{killed} to commit step {KILL_AFTER} to the bucket", checkpointed, timeout=450, interval=0.3)
    volumes = [v for p in kubectl.pods(namespace, killed) for v in p["spec"].get("volumes") or []]
    assert not [v for v in volumes if "persistentVolumeClaim" in v or "hostPath" in v], volumes
    kill_when_running(cluster, kubectl, namespace, killed, f"{killed}-worker-1")
    assert max(committed_steps(store, bucket, namespace, killed)) < STEPS, "the kill came after the last step: raise STEPS"
    wait_restarts(kubectl, namespace, killed, 1)
    done = {name: kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=450) for name in names}
    for name, job in done.items():
        assert job["status"]["phase"] == "Succeeded", (name, job["status"])
    assert done[killed]["status"]["restarts"] == 1 and done[reference]["status"]["restarts"] == 0
    resumed = done[killed]["status"]["result"]["resumedFromStep"]
    # The new gang's pods had empty checkpoint folders: the step came from the bucket.
    assert KILL_AFTER <= resumed < STEPS, done[killed]["status"]["result"]
    ref, got = final_parameters(store, bucket, namespace, reference), final_parameters(store, bucket, namespace, killed)
    assert ref.keys() == got.keys() and ref
    worst = max(float((ref[k].double() - got[k].double()).abs().max()) for k in ref)
    print(f"resumed from step {resumed} (from s3://{bucket}/runs); max |killed - reference| over {len(ref)} "
          f"tensors: {worst:.3g}")
    assert worst <= 1e-6
    # The final model is exported beside the checkpoints in the bucket, weights first, model.json last.
    export = done[killed]["status"]["result"]["export"]
    assert export["path"] == f"s3://{bucket}/runs/{namespace}/{killed}/export" and export["step"] == STEPS, export
    for name in (export["weights"], "model.json"):
        store.client().head_object(Bucket=bucket, Key=f"runs/{namespace}/{killed}/export/{name}")
    # The new gang claimed the prefix after the killed one: its last checkpoint is under a newer claim.
    assert committed(store, bucket, namespace, killed)[STEPS] > 1
