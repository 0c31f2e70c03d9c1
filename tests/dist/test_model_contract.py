"""A `module:factory` model that lacks what its mode needs fails at once with exit 2 (CONFIG: no gang
restart) and a message naming the factory and what is missing, from real trainer processes:
a pipeline without pipeline_blocks() or with fewer blocks than stages or blocks that do not compute
the model's forward, tensor parallel without a tensor-parallel plan. (A model that
does not fit the data and a bad model.init raise the same ConfigError in build_model, before any
process group: tests/unit/test_model_weights.py; its exit code is the one of a factory that does
not import, tests/dist/test_trainer_exitcodes.py.)"""

from __future__ import annotations

import os
from pathlib import Path

from disttrain_api import exitcodes

PLAIN_MODULE = """
from torch import nn

def plain(spec, ds):  # fits the data; no pipeline_blocks(), no tensor_parallel_plan()
    return nn.Linear(ds.input_dim, ds.num_classes)

def one_block(spec, ds):  # a pipeline's blocks, but fewer than its stages
    return nn.Sequential(nn.Linear(ds.input_dim, ds.num_classes))

class Doubled(nn.Module):  # pipeline_blocks() that leave out a step of forward
    def __init__(self, ds):
        super().__init__()
        self.a, self.b = nn.Linear(ds.input_dim, 16), nn.Linear(16, ds.num_classes)

    def forward(self, x):
        return 2 * self.b(self.a(x))

    def pipeline_blocks(self):
        return [self.a, self.b]

def doubled(spec, ds):
    return Doubled(ds)
"""


def test_each_mode_refuses_a_model_without_its_contract_with_exit_2(trainer, make_digits_spec, tmp_path: Path) -> None:  # noqa: ANN001
    (tmp_path / "plain_model.py").write_text(PLAIN_MODULE)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    spec = make_digits_spec(model={"name": "plain_model:plain"}, training={"steps": 2})
    cases = {
        "pipeline": (dict(spec, mode="pipeline", parallelism={"pipeline": 2}), 2,
                     "model.name 'plain_model:plain': a pipeline needs an nn.Sequential or a model with a "
                     "pipeline_blocks() method"),
        "tensor": (dict(spec, mode="tensor", parallelism={"tensor": 2}), 2,
                   "model Linear has no tensor-parallel plan"),
        # What the stages' cut needs beyond the blocks (modes/pipeline/run_state.check_pipeline_model).
        "stages": (dict(spec, mode="pipeline", parallelism={"pipeline": 2}, model={"name": "plain_model:one_block"}), 2,
                   "model plain_model:one_block has 1 blocks, fewer than the 2 stages"),
        "chain": (dict(spec, mode="pipeline", parallelism={"pipeline": 2}, model={"name": "plain_model:doubled"}), 2,
                  "model.name 'plain_model:doubled': its pipeline blocks applied in turn do not compute model(x)"),
    }  # fmt: skip
    started = {job: trainer.start(s, world=world, job=job, env=env) for job, (s, world, _) in cases.items()}
    for job, run in started.items():
        result = run.wait(expect_ok=False)
        assert result.returncodes == [exitcodes.CONFIG] * len(result.returncodes), "\n".join(result.outputs)[-3000:]
        # Every rank, not only the first to get there: the check runs before any collective that a
        # peer which already left would break (parallel/model_contract.py).
        assert all(cases[job][2] in out for out in result.outputs), "\n".join(result.outputs)[-3000:]
