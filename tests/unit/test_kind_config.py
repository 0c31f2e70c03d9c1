"""hack/kind.yaml (`make kind-up`): every worker mounts the host's checkpoint folder at the path
the demo's and the e2e tests' hostPath PersistentVolume uses, so a restarted gang on any node
resumes."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = "/var/lib/disttrain/checkpoints"  # the demo's and the e2e tests' PersistentVolume


def test_workers_mount_the_checkpoint_hostpath() -> None:
    cfg = yaml.safe_load((ROOT / "hack" / "kind.yaml").read_text())
    assert (cfg["kind"], cfg["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    workers = [n for n in cfg["nodes"] if n["role"] == "worker"]
    assert len(workers) == 2
    for node in workers:
        assert {"hostPath": CHECKPOINTS, "containerPath": CHECKPOINTS} in node["extraMounts"]
    for text in ((ROOT / "tests" / "e2e" / "conftest.py").read_text(), (ROOT / "hack" / "demo-checkpoints.yaml").read_text(),
                 (ROOT / "hack" / "cluster.mk").read_text()):
        assert CHECKPOINTS in text
