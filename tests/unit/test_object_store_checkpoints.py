"""The commit protocol of checkpoints on object storage (checkpoints/remote.py) against a real
S3-compatible server: only a marker makes a checkpoint, retention keeps the newest `keep`
markers, and staging is made to match the bucket (uncommitted local copies dropped, committed
ones downloaded, one with a missing or short object skipped). Writers are fenced on the bucket
(remote_fence.py): once a newer attempt has claimed the prefix, the older writer's commit, re-save
and prune are refused and change nothing, and what it committed in the window before is never
picked; a marker whose file list would escape the checkpoint's folder is refused, naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from disttrain_trainer.checkpoints import remote, remote_fence
from disttrain_trainer.checkpoints.fence import Fenced, Writer
from disttrain_trainer.data.object_store import Store

JOB_UID = "0b5e9f1c-job"


@pytest.fixture
def mirrored(s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    bucket = s3_server.bucket("commit")
    root = tmp_path / "staging" / "job"
    uri = remote.prefix(f"s3://{bucket}/runs", "ns", "job")
    remote.attach(root, remote.Remote(store=Store(endpoint=s3_server.url), uri=uri))
    yield root, bucket
    remote.detach(root)
    remote_fence.release(uri)


def write_step(root: Path, step: int, fill: int = 0) -> Path:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(bytes([(step + fill) % 251]) * (100 + step))
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return path


def keys(s3_server: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", []))


def names(root: Path) -> list[str]:
    return [m.name for m in remote.committed(remote.remote_for(root))]  # type: ignore[arg-type]


def test_only_committed_checkpoints_count_and_retention_keeps_the_newest(mirrored: Any, s3_server: Any) -> None:
    root, bucket = mirrored
    remote.take_over(root, Writer(job_uid=JOB_UID, attempt=0))
    for step in (10, 20, 30):
        remote.publish(root, write_step(root, step), keep=2)
    assert names(root) == ["step-00000020.claim-1.committed", "step-00000030.claim-1.committed"]
    assert not any("step-00000010" in k for k in keys(s3_server, bucket))  # marker and objects gone
    # The prefix holds the namespace: a job of the same name in another namespace has its own.
    assert "runs/ns/job/step-00000030/claim-1/state.pt" in keys(s3_server, bucket)
    # Objects of step 40 uploaded, its marker never written (the writer died in between).
    folder = remote.prepare(root, "step-00000040")
    assert folder == "step-00000040/claim-1"
    remote.upload(root, write_step(root, 40), folder, ["meta.json", "state.pt"])
    assert names(root)[-1] == "step-00000030.claim-1.committed"
    assert "runs/ns/job/step-00000040/claim-1/state.pt" in keys(s3_server, bucket)


def test_staging_is_made_to_match_the_bucket_and_a_short_object_is_skipped(
    mirrored: Any, s3_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root, bucket = mirrored
    remote.take_over(root, Writer(job_uid=JOB_UID, attempt=0))
    for step in (10, 20):
        remote.publish(root, write_step(root, step), keep=3)
    write_step(root, 30)  # published here, never uploaded: not a checkpoint any more
    s3_server.client().put_object(Bucket=bucket, Key="runs/ns/job/step-00000020/claim-1/state.pt", Body=b"short")
    fresh = root.parent.parent / "fresh" / "job"
    remote.attach(fresh, remote.remote_for(root))  # type: ignore[arg-type]
    try:
        remote.sync_down(root)
        remote.sync_down(fresh)
    finally:
        remote.detach(fresh)
    assert not (root / "step-00000030").exists()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == ["step-00000010", "step-00000020"]
    # A new pod downloads what is committed; the truncated step 20 is skipped, step 10 is there whole.
    assert sorted(p.name for p in fresh.iterdir() if p.name.startswith("step-")) == ["step-00000010"]
    assert (fresh / "step-00000010" / "state.pt").read_bytes() == (root / "step-00000010" / "state.pt").read_bytes()
    assert "state.pt has 5 bytes" in capsys.readouterr().out


def test_a_replaced_writer_can_neither_commit_nor_overwrite_nor_prune(
    mirrored: Any, s3_server: Any, tmp_path: Path
) -> None:
    """Two writers of one prefix, as a lost node leaves them: the old gang's rank 0 (attempt 0) still
    runs when the new gang's (attempt 1) claims. The old one is played by switching this process's
    claim back to its own (each process holds one claim per prefix)."""
    root, bucket = mirrored
    uri = remote.remote_for(root).uri  # type: ignore[union-attr]
    remote.take_over(root, Writer(job_uid=JOB_UID, attempt=0))
    for step in (10, 20):
        remote.publish(root, write_step(root, step), keep=2)
    old = remote_fence.held(uri)
    assert old is not None
    # The old writer passed its check for step 30 (objects uploading) when the new gang claims.
    folder = remote.prepare(root, "step-00000030")
    remote.upload(root, write_step(root, 30), folder, ["meta.json", "state.pt"])  # type: ignore[arg-type]

    new_root = tmp_path / "new-pod" / "job"
    remote.attach(new_root, remote.remote_for(root))  # type: ignore[arg-type]
    try:
        remote.take_over(new_root, Writer(job_uid=JOB_UID, attempt=1))
        new = remote_fence.held(uri)
        assert sorted(p.name for p in new_root.iterdir() if p.name.startswith("step-")) == [
            "step-00000010", "step-00000020"]
        before = {k: s3_server.client().get_object(Bucket=bucket, Key=k)["ETag"] for k in keys(s3_server, bucket)}

        remote_fence._claims[uri] = old  # the old process goes on
        for act in (lambda: remote.commit(root, "step-00000030", {"state.pt": 130}, 1),
                    lambda: remote.publish(root, root / "step-00000030", 1),
                    lambda: remote.prepare(root, "step-00000020")):  # a re-save of a step the new gang may pick
            with pytest.raises(Fenced, match="restart attempt 1 claimed the checkpoint prefix"):
                act()
        after = {k: s3_server.client().get_object(Bucket=bucket, Key=k)["ETag"] for k in keys(s3_server, bucket)}
        assert after == before, "the fenced writer changed the bucket"
        # The window: a marker the old writer got in between its check and the new claim (written
        # here behind the fence's back) is never picked nor pruned by the new writer, nor by later ones.
        s3_server.client().put_object(Bucket=bucket, Key="runs/ns/job/step-00000030.claim-1.committed",
                                      Body=json.dumps({"step": 30, "files": {"state.pt": 130}}))  # fmt: skip

        remote_fence._claims[uri] = new  # the new process
        assert names(new_root) == ["step-00000010.claim-1.committed", "step-00000020.claim-1.committed"]
        remote.publish(new_root, write_step(new_root, 30, fill=7), keep=1)  # the new gang's own step 30
        assert names(new_root) == ["step-00000030.claim-2.committed"]
        left = keys(s3_server, bucket)
        assert "runs/ns/job/step-00000030.claim-1.committed" in left  # not the new writer's to prune
        assert not any(k.startswith(("runs/ns/job/step-00000010", "runs/ns/job/step-00000020")) for k in left), left
        remote_fence.release(uri)
        remote.take_over(new_root, Writer(job_uid=JOB_UID, attempt=2))  # a later gang
        assert names(new_root) == ["step-00000030.claim-2.committed"]
        assert (new_root / "step-00000030" / "state.pt").read_bytes() == bytes([37]) * 130
        # A process of an older attempt that starts late is refused when it claims.
        remote_fence.release(uri)
        with pytest.raises(Fenced, match="belongs to a replaced gang"):
            remote.take_over(root, Writer(job_uid=JOB_UID, attempt=1))
    finally:
        remote.detach(new_root)


def test_a_marker_listing_a_file_outside_its_folder_is_refused_naming_the_key(
    mirrored: Any, s3_server: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root, bucket = mirrored
    remote.take_over(root, Writer(job_uid=JOB_UID, attempt=0))
    remote.publish(root, write_step(root, 10), keep=3)
    for step, name in ((20, "../../../escaped"), (30, str(tmp_path / "escaped")), (40, "sub/state.pt")):
        s3_server.client().put_object(Bucket=bucket, Key=f"runs/ns/job/step-{step:08d}.claim-1.committed",
                                      Body=json.dumps({"step": step, "files": {name: 1}}))  # fmt: skip
        s3_server.client().put_object(Bucket=bucket, Key=f"runs/ns/job/step-{step:08d}/claim-1/{name.lstrip('/')}",
                                      Body=b"x")  # fmt: skip
    fresh = root.parent.parent / "fresh" / "job"
    remote.attach(fresh, remote.remote_for(root))  # type: ignore[arg-type]
    try:
        remote.sync_down(fresh)
    finally:
        remote.detach(fresh)
    assert sorted(p.name for p in fresh.iterdir() if p.name.startswith("step-")) == ["step-00000010"]
    assert not list(tmp_path.rglob("escaped"))
    out = capsys.readouterr().out
    for step, why in ((20, "has a '..' component"), (30, "is absolute"), (40, "is not a plain file name")):
        assert f"runs/ns/job/step-{step:08d}.claim-1.committed: its commit marker lists" in out and why in out, out


def test_the_export_is_uploaded_with_model_json_last() -> None:
    names = ["tokenizer_config.json", "model.json", "config.json", "model.safetensors", "tokenizer.json"]
    order = remote.export_upload_order(names)
    assert order[-1] == "model.json" and sorted(order) == sorted(names)
