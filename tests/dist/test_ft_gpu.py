"""Fault-tolerant data parallel on CUDA with `disttrain local`: torchft's Manager over its NCCL
process group (ProcessGroupNCCL, whose timeouts abort the communicator); skipped without a GPU.

NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), and the
launcher gives each replica GPUs of its own (CPU with a warning where the machine has too few), so
on a machine with one GPU the job has one replica: the quorum of one, the per-step protocol over
NCCL, FSDP2's shards under the fault-tolerant all-reduce (HSDP), the checkpoint and a gang
restart after a SIGKILL on the GPU. Live recovery from a peer on CUDA needs two GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_ft_local import finish, kill_at, start  # tests/dist is on sys.path (conftest.py)
from test_ft_local import manifest as ft_manifest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def manifest(name: str, *, ft: bool, strategy: str, steps: int, ckpt_every: int) -> str:
    """One replica on one GPU, a quorum every step."""
    return ft_manifest(name, replicas=1, min_replicas=1, steps=steps, ckpt_every=ckpt_every, ft=ft, quorum_interval=1,
                       fsdp=strategy == "fsdp", gpus=1, heartbeat_s=5)  # fmt: skip


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_replica_on_cuda_trains_over_nccl_and_equals_plain_data_parallel(tmp_path: Path, strategy: str) -> None:
    exported = {}
    for name, ft in ((f"ftgpu-{strategy}", True), (f"gpu-{strategy}", False)):
        proc, run_dir = start(tmp_path, manifest(name, ft=ft, strategy=strategy, steps=30, ckpt_every=100),
                              name, pace_s=0.0)  # fmt: skip
        out = finish(proc)
        assert "running on CPU" not in out, out[-2000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["device"] == "cuda", summary
        if ft:
            assert summary["backend"] == "torchft-nccl", summary
            quorums = [r.get("quorum") for r in map(json.loads, (run_dir / "metrics-rank0.jsonl").read_text().splitlines())
                       if "event" not in r]  # fmt: skip
            assert quorums and set(quorums) == {1}, quorums
        exported[ft] = load_file(run_dir / "checkpoints" / name / "export" / "model.safetensors")
    a, b = exported[True], exported[False]
    assert a.keys() == b.keys() and max(float(t.abs().max()) for t in a.values()) > 0
    # One replica: the all-reduce over NCCL sums one part, and the mean divides by one.
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


def test_a_killed_replica_alone_on_cuda_restarts_the_gang_from_its_checkpoint(tmp_path: Path) -> None:
    # One replica and minReplicas 1: no live peer to recover from, so the gang restarts on the GPU
    # from the newest checkpoint (written from CUDA tensors, loaded back onto them).
    steps = 40
    proc, run_dir = start(tmp_path, manifest("ftgpukill", ft=True, strategy="ddp", steps=steps, ckpt_every=10),
                          "ftgpukill", pace_s=0.05)  # fmt: skip
    kill_at(proc, run_dir, rank=0, step=14)
    out = finish(proc)
    assert "fewer than faultTolerance.minReplicas=1: the gang restarts from the newest checkpoint" in out, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["device"] == "cuda" and summary["restartAttempt"] == 1 and summary["resumedFromStep"] >= 10, summary
    end = json.loads((run_dir / "replica0.json").read_text())
    assert end["step"] == steps
