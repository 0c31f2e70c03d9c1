"""hack/kind.yaml and `make kind-up`: every node mounts the host folder that kind's local-path
provisioner is pointed at (sharedFileSystemPath), so a job's checkpoint claim is one folder
shared by pods on every node (ReadWriteMany) and a restarted gang on any node resumes; workers
also mount the folder tests give pods as a static hostPath volume."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VOLUMES = "/var/lib/disttrain/volumes"  # every dynamically provisioned volume
HOST_FOLDER = "/var/lib/disttrain/checkpoints"  # tests/e2e/conftest.py HOST_FOLDER


def test_every_node_mounts_the_shared_volume_folder_and_workers_the_test_folder() -> None:
    cfg = yaml.safe_load((ROOT / "hack" / "kind.yaml").read_text())
    assert (cfg["kind"], cfg["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    assert len([n for n in cfg["nodes"] if n["role"] == "worker"]) == 2
    for node in cfg["nodes"]:
        assert {"hostPath": VOLUMES, "containerPath": VOLUMES} in node["extraMounts"]
        if node["role"] == "worker":
            assert {"hostPath": HOST_FOLDER, "containerPath": HOST_FOLDER} in node["extraMounts"]
    make = (ROOT / "hack" / "cluster.mk").read_text()
    assert f"KIND_VOLUMES := {VOLUMES}" in make and '\\"sharedFileSystemPath\\":\\"$(KIND_VOLUMES)\\"' in make
    assert f'HOST_FOLDER = "{HOST_FOLDER}"' in (ROOT / "tests" / "e2e" / "conftest.py").read_text()
