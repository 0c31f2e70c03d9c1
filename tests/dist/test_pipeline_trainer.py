"""`mode: pipeline` and `mode: hybrid` through `python -m disttrain_trainer` on real gloo processes."""

from __future__ import annotations

import torch
from disttrain_trainer.checkpoints import whole as ckpt
from disttrain_trainer.models import MLP
from disttrain_trainer.parallel.blocks import block_state, split_blocks

HIDDEN, LAYERS = 32, 4


def pipeline_spec(make_digits_spec, **par):  # noqa: ANN001, ANN201
    return make_digits_spec(
        mode="pipeline",
        workers={"replicas": 2},
        parallelism={"pipeline": 2, "microbatches": 4, "schedule": "1F1B", "partition": "profile", **par},
        model={"name": "mlp", "hidden": HIDDEN, "layers": LAYERS},
        training={"steps": 20, "logIntervalSteps": 1},
    )


def blocks_of_data_checkpoint(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The data-mode model's parameters keyed like a pipeline checkpoint (global block index)."""
    loaded = ckpt.load_latest(result.checkpoint_dir)
    assert loaded is not None
    model = MLP(64, HIDDEN, LAYERS, 10, 0.0, "none")
    model.load_state_dict(loaded[1]["model"])
    blocks = split_blocks(model)
    return block_state(blocks, range(len(blocks)))


def pipeline_blocks(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    loaded = ckpt.load_latest(result.checkpoint_dir)
    assert loaded is not None
    return loaded[1]["blocks"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_pipeline_trains_like_one_process(trainer, make_digits_spec) -> None:
    spec = pipeline_spec(make_digits_spec)
    single = dict(spec, mode="data", workers={"replicas": 1}, parallelism={})
    ref = trainer.run(single, world=1, job="one")
    pipe = trainer.run(spec, world=2, job="pipe")
    assert max_diff(blocks_of_data_checkpoint(ref), pipeline_blocks(pipe)) < 1e-5
    s = pipe.summary
    assert s["mode"] == "pipeline" and s["steps"] == 20
    assert abs(s["testAccuracy"] - ref.summary["testAccuracy"]) < 0.01
    plan = s["pipeline"]["plan"]
    assert plan["method"] == "profile" and len(plan["stages"]) == 2 and plan["imbalance"] >= 1.0
    assert [st["stage"] for st in s["pipeline"]["perStage"]] == [0, 1]
    for rank in (0, 1):
        rec = pipe.steps_log(rank)[-1]
        assert rec["stage"] == rank and 0 <= rec["bubble_fraction"] < 1 and rec["act_peak_bytes"] > 0
        # The last stage always waits for the first forward of the first stage; the first stage
        # may find its gradients already back when a slow moment of its own delayed it.
        assert rank == 0 or rec["bubble_fraction"] > 0
        total = rec["compute_s"] + rec["comm_exposed_s"] + rec["data_s"] + rec["idle_s"]
        assert abs(total - rec["step_s"]) < 1e-6
    assert "partition profile: stage 0: blocks 0-" in pipe.outputs[0]


def test_hybrid_data_times_pipeline_equals_one_process(trainer, make_digits_spec) -> None:
    spec = pipeline_spec(make_digits_spec, schedule="GPipe")
    # 4 processes on a 2-core machine: fewer steps, and room for a busy machine.
    spec = dict(spec, mode="hybrid", workers={"replicas": 4}, training={"steps": 8, "logIntervalSteps": 1})
    single = dict(spec, mode="data", workers={"replicas": 1}, parallelism={})
    ref = trainer.run(single, world=1, job="one")
    hybrid = trainer.run(spec, world=4, job="hybrid", timeout=600)
    assert max_diff(blocks_of_data_checkpoint(ref), pipeline_blocks(hybrid)) < 1e-5
    assert hybrid.summary["pipeline"]["dataDegree"] == 2


def test_pipedream_example_trains_digits(trainer) -> None:  # noqa: ANN001
    from pathlib import Path

    import yaml

    example = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "pipedream.yaml"
    spec = yaml.safe_load(example.read_text())["spec"]
    res = trainer.run(spec, world=2, job="pipedream")
    assert res.summary["pipeline"]["schedule"] == "PipeDream"
    assert res.summary["testAccuracy"] >= 0.95
