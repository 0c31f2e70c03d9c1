"""Data parallel against single-process references: real trainer processes on gloo."""

from __future__ import annotations

import json

import pytest
import torch
from disttrain_trainer.checkpoints import whole as ckpt


def final_model(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    loaded = ckpt.load_latest(result.checkpoint_dir)
    assert loaded is not None, f"no checkpoint under {result.checkpoint_dir}"
    return loaded[1]["model"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_processes_equal_one_process_same_global_batch(trainer, make_digits_spec) -> None:
    spec = make_digits_spec()
    one = trainer.run(spec, world=1, job="ddp-w1")
    two = trainer.run(spec, world=2, job="ddp-w2")
    p1, p2 = final_model(one), final_model(two)
    moved = max_diff(p1, final_model_initial(trainer, spec))
    assert moved > 1e-2, "the model did not train at all"
    assert max_diff(p1, p2) < 1e-5
    assert two.summary["worldSize"] == 2 and two.summary["replicaMaxAbsDiff"] == 0.0
    # Rank 0 also leaves the summary in its termination log (read by the operator from pod status).
    assert json.loads((trainer.tmp / "termination-ddp-w2-0.log").read_text())["steps"] == 20
    assert not (trainer.tmp / "termination-ddp-w2-1.log").exists()
    # Gradient accumulation: 2 processes x 2 micro-steps of 16 = the same global batch of 64.
    acc = trainer.run(make_digits_spec(training={"gradAccumulation": 2}), world=2, job="ddp-acc")
    assert max_diff(p1, final_model(acc)) < 1e-5


def final_model_initial(trainer, spec) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The parameters after 0 steps: build the model exactly as the trainer does."""
    from disttrain_api.model import parse_spec
    from disttrain_trainer.data import load_dataset
    from disttrain_trainer.models import build_model

    s = parse_spec(spec)
    return build_model(s, load_dataset(s, trainer.data_cache)).state_dict()


@pytest.mark.parametrize(("compression", "hidden", "bucket_mb"),
                         [("fp16", 32, 25.0), ("powersgd", 32, 25.0), ("powersgd", 512, 0.5)])  # fmt: skip
def test_compression_hooks_keep_replicas_in_sync_and_train(
    trainer, make_digits_spec, compression: str, hidden: int, bucket_mb: float
) -> None:
    # hidden 512 in 0.5 MB buckets: the gradients (3 MB) span several buckets (DDP's first one
    # holds up to 1 MiB), whose PowerSGD all-reduces must be issued in the same order on every
    # rank (gloo pairs them by order).
    spec = make_digits_spec(
        model={"name": "mlp", "hidden": hidden, "layers": 3},
        training={
            "steps": 30,
            "gradientCompression": compression,
            "powerSGDRank": 2,
            "logIntervalSteps": 1,
            "bucketCapMB": bucket_mb,
        },
        optimizer={"name": "adam", "lr": 0.01},
    )
    res = trainer.run(spec, world=2, job=f"hook-{compression}-{hidden}")
    s = res.summary
    assert s["replicaMaxAbsDiff"] == 0.0, s  # every replica applied the same (compressed) update
    losses = [r["loss"] for r in res.steps_log(0)]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    # The hook's collectives were timed by DDP's reducer on every step.
    assert all(r["comm_busy_s"] > 0 for r in res.steps_log(1))


def test_bf16_on_cpu_trains(trainer, make_digits_spec) -> None:
    spec = make_digits_spec(
        training={"steps": 40, "precision": "bf16", "logIntervalSteps": 1},
        optimizer={"name": "adam", "lr": 0.01},
    )
    res = trainer.run(spec, world=2, job="bf16")
    losses = [r["loss"] for r in res.steps_log(0)]
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses
    assert res.summary["precision"] == "bf16"
    assert res.summary["testAccuracy"] > 0.5


def test_unimplemented_mode_and_bad_config_exit_2_with_one_line(trainer, make_digits_spec) -> None:
    # Every mode runs; what stays refused is PipeDream's asynchronous stages with tensor parallelism.
    res = trainer.run(
        make_digits_spec(mode="hybrid", workers={"replicas": 4},
                         parallelism={"tensor": 2, "pipeline": 2, "schedule": "PipeDream"}),
        world=1,
        job="pipe",
        expect_ok=False,
    )
    assert res.returncodes == [2]
    assert "PipeDream runs with parallelism.tensor 1 (got 2)" in res.outputs[0]
    bad = trainer.run(make_digits_spec(data={"batchSize": 63}), world=2, job="bad", expect_ok=False)
    assert bad.returncodes == [2, 2]
    last = [o.strip().splitlines()[-1] for o in bad.outputs]
    assert all(
        line.startswith("disttrain-trainer: ") and "batchSize" in line and "63" in line
        for line in last
    ), last


def test_pod_without_rank_spawns_nproc_local_ranks(trainer, make_digits_spec) -> None:
    """procsPerWorker > 1: no RANK in the env; the trainer starts NPROC_PER_NODE ranks itself."""
    import os
    import subprocess
    import sys

    from disttrain_api import constants as C

    from_spec = make_digits_spec(
        workers={"replicas": 1, "procsPerWorker": 2}, training={"steps": 10}
    )
    config = trainer.spec_file(from_spec, "pod")
    run_dir = trainer.tmp / "runs" / "pod"
    env = {k: v for k, v in os.environ.items() if k not in (C.ENV_RANK, C.ENV_LOCAL_RANK)}
    env |= {
        C.ENV_CONFIG: str(config), C.ENV_WORLD_SIZE: "2", C.ENV_NODE_RANK: "0", C.ENV_NPROC_PER_NODE: "2",
        C.ENV_MASTER_ADDR: "localhost", C.ENV_MASTER_PORT: str(29400 + os.getpid() % 500), C.ENV_JOB: "pod",
        C.ENV_CHECKPOINT_DIR: str(trainer.ckpt_root), C.ENV_RUN_DIR: str(run_dir), C.ENV_METRICS_PORT: "0",
        C.ENV_DATA_CACHE: str(trainer.data_cache), "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "disttrain_trainer"], env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "metrics-rank0.jsonl").exists() and (run_dir / "metrics-rank1.jsonl").exists()
    assert '"worldSize": 2' in (run_dir / "summary.json").read_text()
