"""The commit protocol of checkpoints on object storage (checkpoints/remote.py) against a real
S3-compatible server: only a marker makes a checkpoint, retention keeps the newest `keep`
markers, and staging is made to match the bucket (uncommitted local copies dropped, committed
ones downloaded, one with a missing or short object skipped)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from disttrain_trainer.checkpoints import remote
from disttrain_trainer.data.object_store import Store


@pytest.fixture
def mirrored(s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    bucket = s3_server.bucket("commit")
    root = tmp_path / "staging" / "job"
    remote.attach(root, remote.Remote(store=Store(endpoint=s3_server.url), uri=f"s3://{bucket}/runs/job"))
    yield root, bucket
    remote.detach(root)


def write_step(root: Path, step: int) -> Path:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(bytes(range(step % 7 + 10)) * 100)
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return path


def keys(s3_server: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", []))


def test_only_committed_checkpoints_count_and_retention_keeps_the_newest(mirrored: Any, s3_server: Any) -> None:
    root, bucket = mirrored
    for step in (10, 20, 30):
        remote.publish(root, write_step(root, step), keep=2)
    assert remote.committed(remote.remote_for(root)) == ["step-00000020", "step-00000030"]
    assert not any("step-00000010" in k for k in keys(s3_server, bucket))  # marker and objects gone
    # Objects of step 40 uploaded, its marker never written (the writer died in between).
    write_step(root, 40)
    remote.upload(root, root / "step-00000040", "step-00000040", ["meta.json", "state.pt"])
    assert remote.committed(remote.remote_for(root))[-1] == "step-00000030"
    assert "runs/job/step-00000040/state.pt" in keys(s3_server, bucket)


def test_staging_is_made_to_match_the_bucket_and_a_short_object_is_skipped(
    mirrored: Any, s3_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root, bucket = mirrored
    for step in (10, 20):
        remote.publish(root, write_step(root, step), keep=3)
    write_step(root, 30)  # published here, never uploaded: not a checkpoint any more
    s3_server.client().put_object(Bucket=bucket, Key="runs/job/step-00000020/state.pt", Body=b"short")
    fresh = root.parent.parent / "fresh" / "job"
    remote.attach(fresh, remote.remote_for(root))
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


def test_the_export_is_uploaded_with_model_json_last() -> None:
    names = ["tokenizer_config.json", "model.json", "config.json", "model.safetensors", "tokenizer.json"]
    order = remote.export_upload_order(names)
    assert order[-1] == "model.json" and sorted(order) == sorted(names)
