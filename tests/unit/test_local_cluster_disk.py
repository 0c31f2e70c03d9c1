"""The local cluster refuses an image import the disk cannot hold, before ctr fills it.

Real disk figures, no cluster: the archive is a sparse file whose size (what an import writes)
exceeds the free space of the file system it lies on, while it occupies none of it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))

from localcluster import ClusterError  # noqa: E402
from localcluster.config import ClusterConfig, NodeConfig  # noqa: E402
from localcluster.images import Archive, check_disk  # noqa: E402

REF = "docker.io/library/disttrain-trainer:dev"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DISTTRAIN_CACHE", str(tmp_path))
    return tmp_path


def _archive(cache: Path, size: int) -> Archive:
    path = cache / "images" / "trainer.tar"
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        f.truncate(size)  # sparse: st_size is `size`, no block is written
    return Archive(ref=REF, path=path, digest="d1")


def test_an_import_larger_than_the_free_disk_is_refused_with_the_figures(cache: Path) -> None:
    free = shutil.disk_usage(cache).free
    cfg = ClusterConfig(nodes=(NodeConfig(index=1), NodeConfig(index=2)))
    archive = _archive(cache, free // 2)  # x2 (blobs, snapshots) x 2 nodes: twice the free space
    with pytest.raises(ClusterError) as err:
        check_disk(cfg, {REF: archive})
    msg = str(err.value)
    assert "image import" in msg and "GB is free" in msg and str(cache / "containerd") in msg


def test_nodes_that_hold_the_archive_need_nothing(cache: Path) -> None:
    free = shutil.disk_usage(cache).free
    cfg = ClusterConfig(nodes=(NodeConfig(index=1), NodeConfig(index=2)))
    archive = _archive(cache, free // 2)
    for node in cfg.nodes:  # what import_into records once a node holds the archive
        store = cfg.node_image_store(node)
        store.mkdir(parents=True)
        (store / "imported.json").write_text(json.dumps({REF: archive.digest}))
    check_disk(cfg, {REF: archive})
    # A rebuilt archive (another digest) has to be imported again: refused again.
    with pytest.raises(ClusterError):
        check_disk(cfg, {REF: Archive(ref=REF, path=archive.path, digest="d2")})


def test_a_small_archive_passes(cache: Path) -> None:
    cfg = ClusterConfig(nodes=(NodeConfig(index=1),))
    check_disk(cfg, {REF: _archive(cache, 1 << 20)})
