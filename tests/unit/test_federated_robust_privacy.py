"""Byzantine-robust rules against hand-computed cases, central DP's clipping and noise, the
privacy accountant's wiring (Opacus's RDP accountant), what a private aggregator releases, and
the spec rules for both."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from disttrain_api import metric_names as names
from disttrain_api.model import FedPrivacy, parse_spec
from disttrain_api.validation import check_job
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess, robust
from disttrain_trainer.modes.federated.aggregator import Aggregator
from disttrain_trainer.modes.federated.entry import client_states, make_evaluator
from disttrain_trainer.modes.federated.privacy import PrivacyAccountant, PrivateMean, clip
from disttrain_trainer.modes.federated.settings import client_ids
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.federated_series import AGGREGATOR, FedMetrics
from disttrain_trainer.tensor_transport import auth

# ------------------------------------------------------------------ robust rules


def _rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_median_is_coordinate_wise_and_averages_the_middle_pair_for_even_n() -> None:
    assert robust.median(_rows([1, 10], [3, -2], [2, 4])).tolist() == [2, 4]
    assert robust.median(_rows([1], [2], [3], [10])).tolist() == [2.5]


def test_trimmed_mean_cuts_floor_fraction_n_at_each_end() -> None:
    x = _rows([-100, 5], [1, 5], [2, 5], [3, 5], [100, -50])
    assert robust.trimmed_mean(x, 0.2).tolist() == [2, 5]  # 1 of 5 cut at each end, per coordinate
    assert robust.trimmed_mean(_rows([1], [2], [3], [100]), 0.25).tolist() == [2.5]
    assert robust.trimmed_mean(_rows([1], [2], [3], [100]), 0.2).tolist() == [26.5]  # floor(0.8) = 0: nothing cut
    with pytest.raises(ValueError, match="leaves nothing"):
        robust.trimmed_mean(_rows([1], [2]), 0.5)


def test_krum_scores_and_selection_by_hand() -> None:
    # n = 5, f = 1: each point's score sums its n - f - 2 = 2 smallest squared distances to others.
    x = _rows([0], [1], [2], [10], [11])
    assert robust.krum_scores(x, 1).tolist() == [1 + 4, 1 + 1, 1 + 4, 1 + 64, 1 + 81]
    assert robust.krum_select(x, 1, 1) == [1]
    assert robust.krum_select(x, 1, 2) == [1, 0]  # 0 and 2 tie at 5: the lower index wins
    with pytest.raises(ValueError, match="n > 2f \\+ 2"):
        robust.krum_scores(x, 2)


def test_robust_aggregation_ignores_declared_weights_and_unflattens() -> None:
    shapes = [("w", torch.Size([2, 2])), ("b", torch.Size([1]))]

    def upd(v: float) -> list[tuple[str, torch.Tensor]]:
        return [("w", torch.full((2, 2), v)), ("b", torch.tensor([-v]))]

    # Values 1, 2, 3, 500, 2.5: median 2.5; trimmed (1 of 5 at each end) mean(2, 2.5, 3) = 2.5; Krum
    # (2 nearest, squared distances x 5 coordinates) scores 2.5 lowest, then 2 and 3 tie: Multi-Krum
    # with m = 2 averages 2.5 and 2 (the lower index wins the tie).
    for rule, want in (("fedmedian", 2.5), ("trimmedMean", 2.5), ("krum", 2.5), ("multiKrum", 2.25)):
        agg = robust.RobustAggregation(rule, shapes, trim_fraction=0.2, byzantine=1, selected=2)
        for cid, v, n in (("c0", 1.0, 1), ("c1", 2.0, 1), ("c2", 3.0, 1), ("c3", 500.0, 10_000), ("c4", 2.5, 1)):
            agg.add(cid, upd(v), n)  # c3: far away, and claims most of the samples
        out = agg.result()
        assert out["w"].shape == (2, 2) and out["b"].shape == (1,)
        assert torch.allclose(out["w"], torch.full((2, 2), want)) and torch.allclose(out["b"], torch.tensor([-want])), rule
    # Krum's choice is recorded: the update closest to its neighbours, never the outlier.
    assert agg.info() == {"robust_chosen": ["c4", "c1"]}


# ------------------------------------------------------------------ central DP


def test_clip_scales_the_whole_update_to_the_norm() -> None:
    out, norm = clip([("a", torch.tensor([3.0])), ("b", torch.tensor([4.0]))], 1.0)
    assert norm == 5.0 and [t.tolist() for _, t in out] == [[pytest.approx(0.6)], [pytest.approx(0.8)]]
    out, norm = clip([("a", torch.tensor([0.3, 0.4]))], 1.0)
    assert norm == pytest.approx(0.5) and out[0][1].tolist() == pytest.approx([0.3, 0.4])  # below: untouched


def test_private_mean_sums_clipped_updates_with_equal_weight_over_clients_per_round() -> None:
    shapes = [("a", torch.Size([2]))]
    quiet = FedPrivacy(clip_norm=1.0, noise_multiplier=1e-12)
    pm = PrivateMean(shapes, quiet, clients_per_round=4, generator=torch.Generator().manual_seed(0))
    pm.add("c0", [("a", torch.tensor([3.0, 4.0]))], 100.0)  # clipped to [0.6, 0.8]; its weight is not used
    pm.add("c1", [("a", torch.tensor([0.3, 0.4]))], 1.0)
    assert pm.result()["a"].tolist() == pytest.approx([0.9 / 4, 1.2 / 4])
    assert pm.info() == {}  # how many were clipped is not released


def test_private_mean_clips_a_non_finite_update_to_zero_and_publishes_noise_when_nobody_answered() -> None:
    shapes = [("a", torch.Size([2]))]
    quiet = FedPrivacy(clip_norm=1.0, noise_multiplier=1e-12)
    out, norm = clip([("a", torch.tensor([float("nan"), 1.0]))], 1.0)
    assert not math.isfinite(norm) and out[0][1].tolist() == [0.0, 0.0]
    assert clip([("a", torch.tensor([3e38, 3e38]))], 1.0)[0][0][1].norm() == pytest.approx(1.0)  # no overflow
    pm = PrivateMean(shapes, quiet, clients_per_round=2, generator=torch.Generator().manual_seed(0))
    pm.add("c0", [("a", torch.tensor([float("inf"), 0.0]))], 1.0)
    pm.add("c1", [("a", torch.tensor([0.3, 0.4]))], 1.0)
    assert pm.result()["a"].tolist() == pytest.approx([0.15, 0.2])
    loud = FedPrivacy(clip_norm=1.0, noise_multiplier=1.0)
    empty = PrivateMean(shapes, loud, clients_per_round=2, generator=torch.Generator().manual_seed(0)).result()["a"]
    assert bool(torch.isfinite(empty).all()) and bool((empty != 0).all())  # the step is noise alone


def test_private_mean_noise_has_std_noise_multiplier_times_clip_norm_over_clients_per_round() -> None:
    d = 200_000
    dp = FedPrivacy(clip_norm=2.0, noise_multiplier=1.5)
    pm = PrivateMean([("a", torch.Size([d]))], dp, clients_per_round=5, generator=torch.Generator().manual_seed(1))
    pm.add("c0", [("a", torch.zeros(d))], 1.0)
    noise = pm.result()["a"]
    assert float(noise.std()) == pytest.approx(1.5 * 2.0 / 5, rel=0.01)
    assert abs(float(noise.mean())) < 0.01


def test_accountant_matches_opacus_called_directly_and_grows_with_rounds() -> None:
    from opacus.accountants import RDPAccountant

    dp = FedPrivacy(clip_norm=1.0, noise_multiplier=1.1, delta=1e-5)
    acc = PrivacyAccountant(dp, clients=100, clients_per_round=10)
    direct = RDPAccountant()
    eps = []
    for _ in range(5):
        acc.step()
        direct.step(noise_multiplier=1.1, sample_rate=0.1)
        eps.append(acc.epsilon())
        assert eps[-1] == direct.get_epsilon(delta=1e-5)
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False)) and eps[0] > 0
    again = PrivacyAccountant(dp, clients=100, clients_per_round=10)
    again.load_state_dict(acc.state_dict())
    assert again.steps == 5 and again.epsilon() == eps[-1]


@dataclass(frozen=True)
class PrivateRun:
    spec: Any
    ds: Any
    run: inprocess.InProcessRun
    metrics: FedMetrics
    log_lines: list[str]
    metrics_log: Path
    ckpt: Path


@pytest.fixture(scope="module")
def private_run(tmp_path_factory: pytest.TempPathFactory) -> PrivateRun:
    """Three private rounds over real gRPC; client-1 sends a NaN in every update."""
    tmp = tmp_path_factory.mktemp("private")
    spec = parse_spec({
        "mode": "federated", "model": {"name": "mlp", "hidden": 16, "layers": 1},
        "data": {"name": "digits", "batchSize": 32}, "optimizer": {"name": "sgd", "lr": 0.05},
        "federated": {"clients": 5, "clientsPerRound": 3, "minAnsweredClients": 2, "rounds": 3,
                      "roundTimeoutSeconds": 30, "partition": {"kind": "iid"},
                      "privacy": {"clipNorm": 0.5, "noiseMultiplier": 1.0, "delta": 1e-3}},
    })  # fmt: skip
    torch.set_num_threads(1)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=tmp / "run", checkpoint_root=tmp / "ckpt")
    states = client_states(cfg, ds, client_ids(5))
    metrics_log = tmp / "metrics-rank0.jsonl"
    metrics = FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=metrics_log, private=True)
    lines: list[str] = []
    run = asyncio.run(inprocess.run_job(spec, ds, [states[0::2], states[1::2]], key=auth.new_key(),
                                        checkpoint_dir=tmp / "agg", metrics=metrics, faults={"client-1": "nan"},
                                        evaluate=make_evaluator(cfg, ds), log=lines.append))  # fmt: skip
    metrics.close()
    return PrivateRun(spec=spec, ds=ds, run=run, metrics=metrics, log_lines=lines, metrics_log=metrics_log,
                      ckpt=tmp / "agg")  # fmt: skip


def test_a_private_run_reports_the_budget_each_round_and_a_resumed_aggregator_keeps_it(private_run: PrivateRun) -> None:
    spec, ds, run = private_run.spec, private_run.ds, private_run.run
    h = run.aggregator.history
    direct = PrivacyAccountant(spec.federated.privacy, clients=5, clients_per_round=3)
    for r in h:
        direct.step()
        assert r["epsilon"] == direct.epsilon() and r["delta"] == 1e-3
    assert h[0]["epsilon"] < h[1]["epsilon"] < h[2]["epsilon"]
    summary = run.aggregator.summary()["privacy"]
    assert summary["epsilon"] == h[-1]["epsilon"] and summary["rounds"] == 3 and summary["sampleRate"] == 0.6
    assert summary["sampling"] == "poisson" and summary["unit"] == "client"
    resumed = Aggregator(fed=spec.federated, model=inprocess.build_model(spec, ds).state_dict(),
                         key=auth.new_key(),
                         metrics=FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None, private=True),
                         checkpoint_dir=private_run.ckpt, log=lambda s: None)  # fmt: skip
    resumed.restore()
    assert resumed.privacy is not None and resumed.privacy.epsilon() == h[-1]["epsilon"]


# Series whose values come from individual clients: never exported by a private aggregator.
WITHHELD_SERIES = (names.FED_CLIENTS_SAMPLED, names.FED_CLIENTS_ANSWERED, names.FED_CLIENTS_DROPPED,
                   names.FED_BYTES_UP, names.FED_BYTES_DOWN, names.FED_CLIENT_COMPUTE_SECONDS,
                   names.FED_CLIENT_COMM_SECONDS, names.COMPUTE_SECONDS, names.DATA_SECONDS, names.IDLE_SECONDS,
                   names.COMM_EXPOSED_SECONDS, names.COMM_BUSY_SECONDS)  # fmt: skip


def test_a_private_run_releases_no_un_noised_value_of_any_client(private_run: PrivateRun) -> None:
    """Round records (history, metrics log, checkpoint), the summary (the clients' copy too), the
    Prometheus series and the aggregator's log hold the noised model's accuracy, the budget and
    bookkeeping only: no client's loss, sample count, timing, bytes, clipping, or how many were
    sampled, answered or dropped. A client's non-finite update is not refused (that would be
    counted and logged): it is clipped to zero like any update."""
    agg, metrics = private_run.run.aggregator, private_run.metrics
    released = {"step", "round", "attempt", "steps", "step_s", "test_accuracy", "epsilon", "delta"}
    assert [r["round"] for r in agg.history] == [1, 2, 3]
    assert all(set(r) == released for r in agg.history), agg.history
    logged = [json.loads(line) for line in private_run.metrics_log.read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "time"} for r in logged] == agg.history
    resumed = Aggregator(fed=agg.fed, model=agg.model, key=auth.new_key(), checkpoint_dir=private_run.ckpt,
                         metrics=FedMetrics(job="t", process=AGGREGATOR, port=0, log_path=None, private=True),
                         log=lambda s: None)  # fmt: skip
    resumed.restore()
    assert resumed.history == agg.history  # what the checkpoint keeps
    summary = agg.final_summary
    assert summary is not None and all(r.final_summary == summary for r in private_run.run.runners)
    assert not {"bytesUp", "bytesDown", "computeFraction", "commFraction", "idleFraction"} & set(summary)
    exported = {s.name for m in metrics.registry.collect() for s in m.samples}
    assert not {n for n in exported if n.startswith(WITHHELD_SERIES)}, exported
    assert names.FED_PRIVACY_EPSILON in exported and names.STEP_SECONDS + "_count" in exported
    assert metrics.rejected_count("non_finite") == 0 and metrics.rejected_count("norm") == 0
    assert all(bool(torch.isfinite(t).all()) for t in agg.model.values())
    rounds_logged = [line for line in private_run.log_lines if "done in" in line]
    assert len(rounds_logged) == 3 and all("answered" not in line for line in rounds_logged)
    assert not [line for line in private_run.log_lines if "client-" in line], private_run.log_lines
    agg.log("aggregator: refused client-3: expired_round: a late update")  # the gate logs through it too
    assert private_run.log_lines[-1] == "aggregator: refused a client: expired_round: a late update"


# ------------------------------------------------------------------ spec rules


def _job(**fed: Any) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "job"},
            "spec": {"mode": "federated", "model": {"name": "mlp"}, "data": {"name": "digits", "batchSize": 32},
                     "federated": {"clients": 10, "clientsPerRound": 10, "minAnsweredClients": 5, **fed}}}  # fmt: skip


def _errors(**fed: Any) -> list[str]:
    return [str(e) for e in check_job(_job(**fed))[1]]


@pytest.mark.parametrize(
    ("fed", "want"),
    [
        ({"strategy": "krum", "secureAggregation": True},
         "spec.federated.strategy: krum needs each client's update, which secureAggregation hides"),
        ({"strategy": "trimmedMean", "trimFraction": 0.5}, "spec.federated.trimFraction: 0.5 must be < 0.5"),
        ({"strategy": "trimmedMean", "trimFraction": 0.05},
         "spec.federated.trimFraction: 0.05 trims nothing from clientsPerRound 10 updates"),
        ({"strategy": "krum", "byzantineClients": 2},
         "spec.federated.minAnsweredClients: 5 must be >= 2 x byzantineClients + 3 = 7 with krum"),
        ({"strategy": "multiKrum", "multiKrumSelected": 5},
         "spec.federated.multiKrumSelected: 5 must be <= minAnsweredClients - byzantineClients = 4"),
        ({"privacy": {"clipNorm": 1, "noiseMultiplier": 1}, "secureAggregation": True},
         "spec.federated.privacy: central differential privacy clips each update at the aggregator"),
        ({"privacy": {"clipNorm": 1, "noiseMultiplier": 1}, "strategy": "fedmedian"},
         "spec.federated.privacy: the noise is calibrated to a mean of clipped updates; strategy fedmedian"),
        ({"privacy": {"clipNorm": 1, "noiseMultiplier": 1, "delta": 0.1}},
         "spec.federated.privacy.delta: 0.1 must be < 1 / clients = 0.1"),
        ({"privacy": {"noiseMultiplier": 1}}, "spec.federated.privacy.clipNorm"),
        ({"privacy": {"clipNorm": 1, "noiseMultiplier": 0}}, "spec.federated.privacy.noiseMultiplier"),
    ],
)
def test_robust_and_private_specs_refused_with_the_field_and_the_fix(fed: dict[str, Any], want: str) -> None:
    errors = _errors(**fed)
    assert any(e.startswith(want) for e in errors), errors


def test_valid_robust_and_private_specs_pass() -> None:
    for fed in ({"strategy": "trimmedMean", "trimFraction": 0.1}, {"strategy": "krum", "byzantineClients": 1},
                {"strategy": "multiKrum", "multiKrumSelected": 4}, {"strategy": "fedmedian"},
                {"privacy": {"clipNorm": 0.5, "noiseMultiplier": 1.1}, "strategy": "fedadam"}):  # fmt: skip
        assert _errors(**fed) == [], fed
    assert math.isclose(parse_spec(_job(privacy={"clipNorm": 1, "noiseMultiplier": 1})["spec"]).federated.privacy.delta, 1e-5)
