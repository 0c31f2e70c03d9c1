"""Your model, your data, on the cluster: a job whose model factory comes from a user image
(examples/my_model, built FROM the trainer image: hack/localcluster/images.py) and whose token
files (format tokens, train.bin / val.bin) sit on a PersistentVolumeClaim Succeeds, a twin
whose trainer is SIGKILLed once mid-run resumes from its last checkpoint and ends at exactly
the same parameters, and both export the trained model (status.result.export) as safetensors
that load into the user's own model class.

The user image exists on the local cluster only (its image pipeline builds it), hence the
`local_cluster` fixture, which also does the kill.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from .conftest import (  # type: ignore[import-not-found]
    HOST_FOLDER,
    ROOT,
    Kubectl,
    OperatorProcess,
    checkpoint_dir,
    checkpoint_steps,
    job_manifest,
)
from .test_chaos import kill_when_running, wait_for_checkpoint, wait_restarts  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)
USER_IMAGE = "disttrain-my-model:dev"  # hack/localcluster/config.py USER_IMAGE
FACTORY = "my_model.lm:factory"
EXAMPLE = ROOT / "examples" / "my_model"
CORPUS_CLAIM = "corpus"
VOCAB, BLOCK, HIDDEN, LAYERS = 96, 32, 32, 2
# One kill after the first checkpoint at or past KILL_AFTER; STEPS leaves training after it
# (a kill that meets a finished trainer fails by name), INTERVAL keeps the replay short.
STEPS, INTERVAL, KILL_AFTER = 600, 20, 40


def write_corpus(folder: Path) -> None:
    """nanoGPT's layout: flat uint16 token ids, train.bin and val.bin. A repeating phrase with
    noise, so the loss has something to learn."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    phrase = rng.integers(0, VOCAB, 50)
    ids = np.tile(phrase, 200)
    noise = rng.random(ids.size) < 0.1
    ids[noise] = rng.integers(0, VOCAB, int(noise.sum()))
    split = int(ids.size * 0.9)
    ids[:split].astype(np.uint16).tofile(folder / "train.bin")
    ids[split:].astype(np.uint16).tofile(folder / "val.bin")


def corpus_claim(kubectl: Kubectl, ns: str, folder: Path) -> str:
    """A claim CORPUS_CLAIM in `ns`, pre-bound to a hostPath volume of `folder` (every node of the
    local cluster shares this machine's folders, as a network file system would); returns the
    volume's name."""
    pv = f"disttrain-corpus-{ns}"
    access = {"accessModes": ["ReadOnlyMany"], "storageClassName": ""}
    docs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv}, "spec": {
            **access, "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {"namespace": ns, "name": CORPUS_CLAIM}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CORPUS_CLAIM, "namespace": ns},
         "spec": {**access, "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}},
    ]
    kubectl.run("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    kubectl.wait_for(f"claim {ns}/{CORPUS_CLAIM} to bind", lambda: kubectl.run(
        "get", "pvc", CORPUS_CLAIM, "-n", ns, "-o", "jsonpath={.status.phase}").stdout == "Bound",
        timeout=60, interval=0.5)
    return pv


def user_job(name: str, ns: str) -> dict[str, Any]:
    obj = job_manifest(name, ns, steps=STEPS,
                       workers={"replicas": 2, "resources": {"cpu": "500m", "memory": "768Mi"},
                                "template": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]}},
                       model={"name": FACTORY, "hidden": HIDDEN, "layers": LAYERS, "blockSize": BLOCK},
                       data={"path": "corpus", "format": "tokens", "tokenDtype": "uint16", "vocabSize": VOCAB,
                             "volume": {"persistentVolumeClaim": {"claimName": CORPUS_CLAIM}}, "batchSize": 16},
                       optimizer={"name": "adamw", "lr": 0.003},
                       checkpoint={"intervalSteps": INTERVAL, "keep": 2},  # on the claim the operator makes
                       runPolicy={"backoffLimit": 2})
    del obj["spec"]["data"]["name"]  # a path instead of a built-in dataset
    obj["spec"]["image"] = USER_IMAGE
    obj["spec"]["training"].update(evalIntervalSteps=0, logIntervalSteps=20)
    return obj


def exported(kubectl: Kubectl, job: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The export that status.result names, read from the checkpoint volume (this machine's folder)."""
    name, export = job["metadata"]["name"], job["status"]["result"]["export"]
    assert export["step"] == STEPS and export["path"].endswith(f"/{name}/export"), export
    folder = checkpoint_dir(kubectl, job["metadata"]["namespace"], name)
    assert folder is not None
    return load_file(folder / "export" / export["weights"])


@pytest.fixture
def corpus(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    # A folder every node of the local cluster (and of kind: hack/kind.yaml) has.
    folder = Path(HOST_FOLDER) / f"{namespace}-data"
    write_corpus(folder / "corpus")
    pv = corpus_claim(kubectl, namespace, folder)
    yield namespace
    kubectl.run("delete", "persistentvolume", pv, "--wait=false", check=False)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def names() -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:5]
    yield (f"byo-ref-{suffix}", f"byo-{suffix}")  # their checkpoints go with their namespace


@pytest.fixture
def user_model_class(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[torch.nn.Module]]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    importlib.invalidate_caches()
    module = importlib.import_module("my_model.lm")
    yield module.TokenModel
    for mod in [m for m in sys.modules if m == "my_model" or m.startswith("my_model.")]:
        del sys.modules[mod]


def test_user_model_on_token_data_from_a_claim_resumes_exactly_and_exports(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, corpus: str,
    names: tuple[str, str], user_model_class: type[torch.nn.Module],
) -> None:
    cluster = request.getfixturevalue("local_cluster")  # the user image and the SIGKILL: the local cluster only
    ns, (reference, killed) = corpus, names
    for name in names:  # at once: the reference costs no extra wall time
        kubectl.apply(user_job(name, ns))
    wait_for_checkpoint(kubectl, ns, killed, KILL_AFTER)
    images = {c["image"] for n in names for p in kubectl.pods(ns, n) for c in p["spec"]["containers"]}
    assert images == {USER_IMAGE}, images
    kill_when_running(cluster, kubectl, ns, killed, f"{killed}-worker-1")
    newest = max(checkpoint_steps(kubectl, ns, killed))
    assert newest < STEPS, f"the kill came after the last step ({newest}): raise STEPS"
    wait_restarts(kubectl, ns, killed, 1)
    done = {name: kubectl.wait_phase(ns, name, ("Succeeded", "Failed"), timeout=300) for name in names}
    for name, job in done.items():
        assert job["status"]["phase"] == "Succeeded", (name, job["status"])
    assert done[killed]["status"]["restarts"] == 1 and done[reference]["status"]["restarts"] == 0
    assert done[killed]["status"]["result"]["resumedFromStep"] >= KILL_AFTER, done[killed]["status"]["result"]
    ref, got = exported(kubectl, done[reference]), exported(kubectl, done[killed])
    assert ref.keys() == got.keys() and ref
    worst = max(float((ref[k].double() - got[k].double()).abs().max()) for k in ref)
    print(f"resumed from step {done[killed]['status']['result']['resumedFromStep']}; "
          f"max |killed - reference| over {len(ref)} exported tensors: {worst:.3g}")
    assert worst <= 1e-6
    model = user_model_class(vocab=VOCAB, width=HIDDEN, depth=LAYERS, dropout=0.0)
    model.load_state_dict(got, strict=True)
    ids = torch.from_numpy(np.fromfile(Path(HOST_FOLDER) / f"{ns}-data" / "corpus" / "val.bin",
                                       dtype=np.uint16)[: BLOCK + 1].astype(np.int64))[None]
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[0, 1:])
    assert loss < np.log(VOCAB), f"the exported model predicts no better than chance: {loss:.3f}"
