"""Checkpoints on a real S3-compatible server (moto, keys checked), through real trainer processes:
a 2-rank run publishes each checkpoint by a commit marker after its objects, keeps the newest
`keep`, and a run on a fresh pod (empty staging) resumes from the newest *committed* one exactly,
under a claim of its own, after which a late process of the replaced attempt is fenced off the
bucket (exit 4) and changes nothing;
a committed checkpoint whose object was truncated is skipped for the one before (here at another
world size); sharded checkpoints from ranks on separate disks commit and resume; a missing bucket
is exit 2 before training, an endpoint that does not answer exit 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_trainer.checkpoints import whole as ckpt
from ports import free_port  # tests/ports.py: each xdist worker's own slice

pytestmark = pytest.mark.dist

STEPS = 12


def write_corpus(folder: Path, n: int = 4000) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(5).integers(0, 200, n).astype(np.uint16)
    ids.tofile(folder / "train.bin")


def gpt_spec(corpus: str, *, uri: str | None = None, endpoint: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": "data",
        "model": {"name": "gpt", "hidden": 32, "layers": 1, "heads": 2, "blockSize": 16},
        "data": {"path": corpus, "format": "tokens", "vocabSize": 256, "batchSize": 8, "seed": 2},
        "optimizer": {"name": "adamw", "lr": 0.003, "scaleLR": "none", "decay": "none"},
        "training": {"steps": STEPS, "logIntervalSteps": 4},
        "checkpoint": {"intervalSteps": 4, "keep": 2, **({"uri": uri} if uri else {})},
    }
    if endpoint:
        spec["objectStore"] = {"endpoint": endpoint}
    return spec


def keys(server: Any, bucket: str) -> list[str]:
    listing = server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    return sorted(o["Key"] for o in listing)


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_a_2_rank_run_on_s3_resumes_from_the_newest_committed_checkpoint_exactly(
    trainer: Any, s3_server: Any, tmp_path: Path
) -> None:
    write_corpus(tmp_path / "corpus")
    bucket = s3_server.bucket("ckpt")
    data_bucket = s3_server.bucket("data")
    s3_server.client().upload_file(str(tmp_path / "corpus" / "train.bin"), data_bucket, "corpus/train.bin")
    spec = gpt_spec(f"s3://{data_bucket}/corpus", uri=f"s3://{bucket}/runs", endpoint=s3_server.url)
    attempt = {C.ENV_JOB_UID: "uid-gpt", C.ENV_RESTART_ATTEMPT: "0"}
    first = trainer.run(spec, world=2, job="gpt", env={**s3_server.env(), **attempt})  # uninterrupted: the reference
    assert first.summary["resumedFromStep"] is None
    objects = keys(s3_server, bucket)
    # keep 2: steps 8 and 12 committed; 4 was pruned marker first, then its objects. The prefix
    # holds the namespace (the harness sets none: "default"); the markers the writer's claim.
    assert [k for k in objects if k.endswith(".committed")] == [
        "runs/default/gpt/step-00000008.claim-1.committed", "runs/default/gpt/step-00000012.claim-1.committed"]
    assert not any(k.startswith("runs/default/gpt/step-00000004") for k in objects)
    assert "runs/default/gpt/step-00000012/claim-1/state.pt" in objects
    # The exported model lies beside the checkpoints, and the summary (status.result) names it there.
    assert first.summary["export"]["path"] == f"s3://{bucket}/runs/default/gpt/export"
    assert {"runs/default/gpt/export/model.safetensors", "runs/default/gpt/export/model.json"} <= set(objects)
    # The newest one's objects are all there, but its marker is not: uploaded, never committed.
    s3_server.client().delete_object(Bucket=bucket, Key="runs/default/gpt/step-00000012.claim-1.committed")
    fresh = tmp_path / "other-pod"  # a new gang's empty staging: only the bucket remembers
    again = trainer.run(spec, world=2, job="gpt", env={**s3_server.env(), C.ENV_CHECKPOINT_DIR: str(fresh),
                                                       **attempt, C.ENV_RESTART_ATTEMPT: "1"})  # fmt: skip
    assert again.summary["resumedFromStep"] == 8
    assert_same_model(ckpt.load(fresh / "gpt", STEPS)["model"], ckpt.load(first.checkpoint_dir, STEPS)["model"])
    assert "runs/default/gpt/step-00000012.claim-2.committed" in keys(s3_server, bucket)  # re-saved and committed
    # A process of the replaced attempt 0 that starts only now is refused by the bucket's claims.
    before = keys(s3_server, bucket)
    late = trainer.run(spec, world=1, job="gpt", env={**s3_server.env(), C.ENV_CHECKPOINT_DIR: str(tmp_path / "late"),
                                                      **attempt}, expect_ok=False)  # fmt: skip
    assert late.returncodes == [exitcodes.FENCED], late.outputs[0][-2000:]
    assert "claimed by restart attempt 1" in late.outputs[0]
    assert keys(s3_server, bucket) == before


def test_a_truncated_committed_checkpoint_falls_back_to_the_one_before_at_another_world_size(
    trainer: Any, s3_server: Any, tmp_path: Path
) -> None:
    write_corpus(tmp_path / "corpus")
    bucket = s3_server.bucket("trunc")
    s3_server.client().upload_file(str(tmp_path / "corpus" / "train.bin"), bucket, "corpus/train.bin")
    spec = gpt_spec(f"s3://{bucket}/corpus", uri=f"s3://{bucket}/runs", endpoint=s3_server.url)
    ref = trainer.run(spec, world=1, job="gpt", env=s3_server.env())
    key = "runs/default/gpt/step-00000012/claim-1/state.pt"
    state = s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=state[: len(state) // 2])
    fresh = tmp_path / "other-pod"
    again = trainer.run(spec, world=2, job="gpt", env={**s3_server.env(), C.ENV_CHECKPOINT_DIR: str(fresh)})
    assert again.summary["resumedFromStep"] == 8 and again.summary["worldSize"] == 2
    assert "state.pt has" in again.outputs[0] and "truncated" in again.outputs[0]
    # The global sampler's position is in the checkpoint: two ranks read the rows one did.
    a, b = ckpt.load(fresh / "gpt", STEPS)["model"], ckpt.load(ref.checkpoint_dir, STEPS)["model"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_a_missing_bucket_is_exit_2_and_an_unreachable_store_exit_1(trainer: Any, s3_server: Any, tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus")
    spec = gpt_spec(str(tmp_path / "corpus"), uri="s3://no-such-bucket-y/runs", endpoint=s3_server.url)
    res = trainer.run(spec, world=1, job="nobucket", env=s3_server.env(), expect_ok=False)
    assert res.returncodes == [exitcodes.CONFIG]
    assert "spec.checkpoint.uri" in res.outputs[0] and "'no-such-bucket-y'" in res.outputs[0]
    closed = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on
    spec = gpt_spec(str(tmp_path / "corpus"), uri="s3://ckpt/runs", endpoint=closed)
    res = trainer.run(spec, world=1, job="closed", env=s3_server.env(), expect_ok=False)
    assert res.returncodes == [exitcodes.FAILED]
    assert "not reachable" in res.outputs[0]


def test_sharded_checkpoints_from_ranks_on_separate_disks_commit_and_resume(
    trainer: Any, s3_server: Any, tmp_path: Path
) -> None:
    """FSDP2 (DCP): each rank stages on a disk of its own, as pods do; every rank uploads its own
    shards, rank 0 commits, and a fresh gang downloads the whole checkpoint onto every disk."""
    write_corpus(tmp_path / "corpus")
    bucket = s3_server.bucket("dcp")
    spec = {**gpt_spec(str(tmp_path / "corpus"), uri=f"s3://{bucket}/runs", endpoint=s3_server.url),
            "parallelism": {"dataStrategy": "fsdp"}}  # fmt: skip
    disks = [{C.ENV_CHECKPOINT_DIR: str(tmp_path / f"pod-{r}")} for r in range(2)]
    first = trainer.run(spec, world=2, job="gpt", env=s3_server.env(), rank_env=disks)
    objects = keys(s3_server, bucket)
    shards = [k for k in objects if k.startswith("runs/default/gpt/step-00000012/claim-1/") and k.endswith(".distcp")]
    assert len(shards) == 2, objects  # one per rank, each uploaded from its own disk
    assert not (tmp_path / "pod-1" / "gpt" / "step-00000012").exists()  # rank 1 never had the whole checkpoint
    s3_server.client().delete_object(Bucket=bucket, Key="runs/default/gpt/step-00000012.claim-1.committed")
    fresh = [{C.ENV_CHECKPOINT_DIR: str(tmp_path / f"new-pod-{r}")} for r in range(2)]
    again = trainer.run(spec, world=2, job="gpt", env=s3_server.env(), rank_env=fresh)
    assert again.summary["resumedFromStep"] == 8
    assert first.summary["valLoss"] == again.summary["valLoss"]  # the same parameters, evaluated
