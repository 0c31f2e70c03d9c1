"""Your own data files through real trainer processes: a GPT on a memory-mapped token file and a
regression (training.loss mse) on a CSV file resume at another world size exactly, a parameter-server job trains on .npy arrays beside its
manifest (`disttrain local`), as do federated clients, and a truncated file stops every rank with exit 2 before training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from disttrain_api import exitcodes
from disttrain_trainer.checkpoints import whole as ckpt

STEPS = 20


def write_corpus(folder: Path, n: int = 6000) -> None:
    """nanoGPT's layout: train.bin and val.bin, flat uint16 token ids (bytes of CPython's help text)."""
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics)).encode()
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    ids[:n].tofile(folder / "train.bin")
    ids[n : n + n // 5].tofile(folder / "val.bin")


def gpt_spec(corpus: Path) -> dict[str, Any]:
    return {
        "mode": "data",
        "model": {"name": "gpt", "hidden": 32, "layers": 1, "heads": 2, "blockSize": 16},
        "data": {"path": str(corpus), "format": "tokens", "vocabSize": 256, "batchSize": 8, "seed": 2},
        "optimizer": {"name": "adamw", "lr": 0.003, "scaleLR": "none", "decay": "none"},
        "training": {"steps": STEPS, "logIntervalSteps": 5},
        "checkpoint": {"intervalSteps": 10, "keep": 3},
    }


def final_model(root: Path) -> dict[str, torch.Tensor]:
    return ckpt.load(root, STEPS)["model"]


def test_a_token_file_run_at_2_ranks_resumes_at_1_exactly(trainer, tmp_path: Path) -> None:  # noqa: ANN001
    write_corpus(tmp_path / "corpus")
    spec = gpt_spec(tmp_path / "corpus")
    ref = trainer.run(spec, world=2, job="w2")  # uninterrupted; checkpoints at 10 and 20
    assert ref.summary["valLoss"] < 5.0
    target = trainer.ckpt_root / "w1"
    target.mkdir(parents=True)
    shutil.copytree(ref.checkpoint_dir / ckpt.name_for(10), target / ckpt.name_for(10))
    one = trainer.run(spec, world=1, job="w1")
    assert one.summary["resumedFromStep"] == 10 and one.summary["worldSize"] == 1
    # The global sampler position is in the checkpoint: one rank reads the rows both did.
    a, b = final_model(ref.checkpoint_dir), final_model(one.checkpoint_dir)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_a_regression_on_csv_at_2_ranks_resumes_at_1_exactly(trainer, tmp_path: Path) -> None:  # noqa: ANN001
    """training.loss mse on decimal labels of a CSV file, through the real loop: it learns, and the
    run resumed at another world size ends with the uninterrupted run's parameters."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 4))
    pcsv.write_csv(pa.table({**{f"f{i}": x[:, i] for i in range(4)}, "target": x @ [1.0, -2.0, 0.5, 3.0]}),
                   tmp_path / "d.csv")  # fmt: skip
    spec = {"mode": "data", "model": {"name": "mlp", "hidden": 16, "layers": 1},
            "data": {"path": str(tmp_path / "d.csv"), "format": "csv", "featureColumns": [f"f{i}" for i in range(4)],
                     "labelColumn": "target", "batchSize": 16, "seed": 1},
            "optimizer": {"name": "adam", "lr": 0.05, "scaleLR": "none", "decay": "none"},
            "training": {"steps": STEPS, "logIntervalSteps": 5, "loss": "mse"},
            "checkpoint": {"intervalSteps": 10, "keep": 3}}  # fmt: skip
    ref = trainer.run(spec, world=2, job="mse2")
    assert ref.summary["valLoss"] < 7.0  # half the targets' variance (about 14.25)
    target = trainer.ckpt_root / "mse1"
    target.mkdir(parents=True)
    shutil.copytree(ref.checkpoint_dir / ckpt.name_for(10), target / ckpt.name_for(10))
    one = trainer.run(spec, world=1, job="mse1")
    assert one.summary["resumedFromStep"] == 10 and one.summary["worldSize"] == 1
    a, b = final_model(ref.checkpoint_dir), final_model(one.checkpoint_dir)
    assert a["head.weight"].shape == (1, 16)  # one output: a regression
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_a_truncated_token_file_stops_every_rank_with_exit_2(trainer, tmp_path: Path) -> None:  # noqa: ANN001
    write_corpus(tmp_path / "corpus")
    data = (tmp_path / "corpus" / "train.bin").read_bytes()
    (tmp_path / "corpus" / "train.bin").write_bytes(data[:-1])  # an odd byte count: not whole uint16 ids
    bad = trainer.run(gpt_spec(tmp_path / "corpus"), world=2, job="bad", expect_ok=False)
    assert exitcodes.CONFIG in bad.returncodes and set(bad.returncodes) <= {exitcodes.CONFIG, 1}, bad.returncodes
    assert "not a whole number of uint16 token ids" in "\n".join(bad.outputs)


PARAMSERVER = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: ps-npy}
spec:
  mode: paramserver
  workers: {replicas: 2}
  model: {name: mlp, hidden: 32, layers: 1}
  data: {path: digits, format: npy, batchSize: 64, seed: 1}
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, decay: none}
  training: {steps: 40, logIntervalSteps: 10}
  paramServer: {maxStaleness: 4, shards: 1}
  checkpoint: {intervalSteps: 20, keep: 2}
"""


FEDERATED = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: fed-npy}
spec:
  mode: federated
  workers: {replicas: 2}
  model: {name: mlp, hidden: 32, layers: 1}
  data: {path: digits, format: npy, batchSize: 32, seed: 1}
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, decay: none}
  federated: {clients: 4, clientsPerRound: 4, rounds: 6, localEpochs: 1, partition: {kind: dirichlet, alpha: 1.0}}
  checkpoint: {intervalSteps: 10, keep: 2}
"""


@pytest.mark.parametrize(("manifest", "accuracy"), [(PARAMSERVER, 0.8), (FEDERATED, 0.7)],
                         ids=["paramserver", "federated"])
def test_npy_arrays_beside_the_manifest_train_every_served_mode(tmp_path: Path, manifest: str,
                                                                 accuracy: float) -> None:
    """Parameter-server workers shard the rows, federated clients partition them by label
    (Dirichlet: the labels are read from the file)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    (tmp_path / "digits").mkdir()
    np.save(tmp_path / "digits" / "x.npy", (x / 16.0).astype(np.float32))
    np.save(tmp_path / "digits" / "y.npy", y.astype(np.int64))
    (tmp_path / "job.yaml").write_text(manifest)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "disttrain_cli", "local", str(tmp_path / "job.yaml"), "--run-dir", str(run_dir),
           "--no-progress", "--metrics-port", "0"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    local = json.loads((run_dir / "local-summary.json").read_text())
    assert local["status"] == "Succeeded" and local["testAccuracy"] >= accuracy, local
