"""Converted data once per job, on the cluster: two 4-pod jobs train on the same parquet file on
a claim (format parquet: converted into the data cache before training), each with its
checkpoints on the claim the operator makes for it, whose root holds the job's data cache. Of a
job's 4 pods one converts, the others wait and read its entry; one job's trainer is SIGKILLed
mid-run, and its new gang converts nothing (the entry is the same folder, and no new pod logs a
build). The killed job resumes and ends at exactly the parameters of the uninterrupted one.

The SIGKILL needs the node's runtime: the local cluster only.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import (  # type: ignore[import-not-found]
    HOST_FOLDER,
    Kubectl,
    OperatorProcess,
    checkpoint_dir,
    checkpoint_steps,
    job_manifest,
    volume_folder,
)
from .test_chaos import kill_when_running, wait_for_checkpoint, wait_restarts  # type: ignore[import-not-found]
from .test_user_image import CORPUS_CLAIM, corpus_claim  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)
# The kill must land before the job ends. The test reads the first gang's logs between the
# checkpoint of step KILL_AFTER and the kill, which takes seconds to tens of seconds on a busy
# host, while the 4 pods train about 35 steps/s on an idle one: 600 steps ended first once.
STEPS, INTERVAL, KILL_AFTER = 1500, 20, 40
FEATURES = 8
BUILD = "data cache: building parquet-"


def write_rows(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4000, FEATURES))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)
    pq.write_table(pa.table({**{f"f{i}": x[:, i] for i in range(FEATURES)}, "label": y}), folder / "d.parquet")


def parquet_job(name: str, ns: str) -> dict[str, Any]:
    obj = job_manifest(name, ns, steps=STEPS,
                       workers={"replicas": 4, "resources": {"cpu": "250m", "memory": "768Mi"},
                                "template": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]}},
                       model={"name": "mlp", "hidden": 32, "layers": 1},
                       data={"path": "rows/d.parquet", "format": "parquet", "batchSize": 32,
                             "featureColumns": [f"f{i}" for i in range(FEATURES)],
                             "volume": {"persistentVolumeClaim": {"claimName": CORPUS_CLAIM}}},
                       optimizer={"name": "sgd", "lr": 0.05},
                       checkpoint={"intervalSteps": INTERVAL, "keep": 2},  # on the claim the operator makes
                       runPolicy={"backoffLimit": 2})  # fmt: skip
    del obj["spec"]["data"]["name"]  # a path instead of a built-in dataset
    obj["spec"]["training"].update(evalIntervalSteps=0, logIntervalSteps=20)
    return obj


def exported(kubectl: Kubectl, job: dict[str, Any]) -> dict[str, Any]:
    """The export that status.result names, read from the job's checkpoint claim (this machine's folder)."""
    from safetensors.torch import load_file

    name, export = job["metadata"]["name"], job["status"]["result"]["export"]
    assert export["step"] == STEPS and export["path"].endswith(f"/{name}/export"), export
    folder = checkpoint_dir(kubectl, job["metadata"]["namespace"], name)
    assert folder is not None, f"{name}: its checkpoint claim is not bound"
    return load_file(folder / "export" / export["weights"])


def cache_entries(kubectl: Kubectl, ns: str, job: str) -> set[Path]:
    """The parquet entries of the job's data cache (`.data-cache` at the root of its claim)."""
    volume = volume_folder(kubectl, ns, f"{job}-checkpoints")
    return set((volume / ".data-cache").glob("parquet-*")) if volume is not None else set()


def logs(kubectl: Kubectl, ns: str, job: str) -> dict[str, str]:
    """The trainer log of each pod of the job's current gang (read at once: the job trains on)."""
    names = [p["metadata"]["name"] for p in kubectl.pods(ns, job)]
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        texts = pool.map(lambda pod: kubectl.run("logs", "-n", ns, pod, "-c", "trainer", check=False).stdout, names)
        return dict(zip(names, texts, strict=True))


def one_builder(gang: dict[str, str]) -> None:
    """Of a 4-pod gang's logs, exactly one says it built the entry."""
    assert len(gang) == 4, sorted(gang)
    builders = [pod for pod, text in gang.items() if BUILD in text]
    assert len(builders) == 1, {pod: [x for x in t.splitlines() if "data cache" in x] for pod, t in gang.items()}


@pytest.fixture
def rows(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    folder = Path(HOST_FOLDER) / f"{namespace}-data"
    write_rows(folder / "rows")
    pv = corpus_claim(kubectl, namespace, folder)
    yield namespace
    kubectl.run("delete", "persistentvolume", pv, "--wait=false", check=False)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_4_pod_job_converts_once_and_its_restarted_gang_not_at_all(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, rows: str,
) -> None:
    cluster = request.getfixturevalue("local_cluster")  # the SIGKILL: the local cluster only
    ns, suffix = rows, uuid.uuid4().hex[:5]
    reference, killed = names = (f"cache-ref-{suffix}", f"cache-{suffix}")
    for name in names:
        kubectl.apply(parquet_job(name, ns))
    wait_for_checkpoint(kubectl, ns, killed, KILL_AFTER)
    wait_for_checkpoint(kubectl, ns, reference, INTERVAL)
    # Both jobs' first gangs are read before the kill, while they train: the killed job's pods go
    # with the kill, and a loaded cluster may disrupt the reference's too (a node that misses its
    # heartbeats has its pods evicted: a disruption the job resumes from, with a new gang's logs).
    for name in names:
        one_builder(logs(kubectl, ns, name))
    (entry,) = cache_entries(kubectl, ns, killed)
    born = entry.stat().st_ino, entry.stat().st_mtime_ns
    kill_when_running(cluster, kubectl, ns, killed, f"{killed}-worker-1")
    assert max(checkpoint_steps(kubectl, ns, killed)) < STEPS, "the kill came after the last step: raise STEPS"
    wait_restarts(kubectl, ns, killed, 1)
    done = {name: kubectl.wait_phase(ns, name, ("Succeeded", "Failed"), timeout=450) for name in names}
    for name, job in done.items():
        assert job["status"]["phase"] == "Succeeded", (name, job["status"])
    assert done[killed]["status"]["restarts"] == 1
    assert not [pod for pod, text in logs(kubectl, ns, killed).items() if BUILD in text]  # the new gang
    assert cache_entries(kubectl, ns, killed) == {entry}
    assert (entry.stat().st_ino, entry.stat().st_mtime_ns) == born  # the same entry: converted zero times
    assert done[killed]["status"]["result"]["resumedFromStep"] >= KILL_AFTER, done[killed]["status"]["result"]
    ref, got = exported(kubectl, done[reference]), exported(kubectl, done[killed])
    worst = max(float((ref[k].double() - got[k].double()).abs().max()) for k in ref)
    print(f"resumed from step {done[killed]['status']['result']['resumedFromStep']}; "
          f"max |killed - reference| over {len(ref)} exported tensors: {worst:.3g}")
    assert ref.keys() == got.keys() and worst <= 1e-6
