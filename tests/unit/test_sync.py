"""LocalSGD and DiLoCo (parallel/sync.py) against hand-computed replicas, and the scaling forecast
aware of them (communication once per interval)."""

from __future__ import annotations

import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_api.scaling import Layout, measured_from_summary
from disttrain_trainer.parallel.sync import OuterSync

from .test_scaling_model import MS, predict, summary  # type: ignore[import-not-found]


class TwoReplicas:
    """An averager as if a second replica held `other` (its values), or one whose vote fails."""

    def __init__(self, other: list[torch.Tensor], *, commit: bool = True) -> None:
        self.other, self.commit = other, commit

    def average(self, tensors: list[torch.Tensor]) -> bool:
        for t, o in zip(tensors, self.other, strict=True):
            t.add_(o).div_(2)
        return self.commit


def model(value: float) -> torch.nn.Linear:
    m = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(value)
    return m


def sync(kind: str, first: int = 0, **outer: object) -> object:
    spec = {"kind": kind, "interval": 4, "outerOptimizer": outer, "everyStepFirst": first}
    return parse_spec({"training": {"sync": spec}}).training.sync


def test_localsgd_averages_the_parameters_every_interval() -> None:
    m = model(1.0)
    s = OuterSync(m, sync("localsgd"), TwoReplicas([torch.full((1, 2), 3.0)]))
    assert [s.due(k) for k in range(1, 9)] == [False, False, False, True] * 2
    res = s.sync()
    assert res.committed and res.bytes == 8 and s.syncs == 1
    assert torch.equal(m.weight, torch.full((1, 2), 2.0)) and torch.equal(s.anchor[0], m.weight)


def test_diloco_applies_the_averaged_pseudo_gradient_with_the_outer_optimizer() -> None:
    # anchor 0; this replica moved to 1, the other to 3: pseudo-gradients -1 and -3, mean -2.
    m = model(0.0)
    s = OuterSync(m, sync("diloco", name="sgd", lr=0.5), TwoReplicas([torch.full((1, 2), -3.0)]))
    with torch.no_grad():
        m.weight.fill_(1.0)
    s.sync()
    assert torch.allclose(m.weight, torch.full((1, 2), 1.0))  # 0 - 0.5 x (-2)
    # Nesterov momentum 0.9, lr 0.7 (the paper's): update = lr x (g + 0.9 x buf), buf = g at the first step.
    n = model(0.0)
    s2 = OuterSync(n, sync("diloco"), TwoReplicas([torch.full((1, 2), -3.0)]))
    with torch.no_grad():
        n.weight.fill_(1.0)
    s2.sync()
    assert torch.allclose(n.weight, torch.full((1, 2), 0.7 * 2 * 1.9))


def test_a_discarded_sync_goes_back_to_the_anchor_and_state_round_trips() -> None:
    m = model(1.0)
    s = OuterSync(m, sync("diloco"), TwoReplicas([torch.full((1, 2), 5.0)], commit=False))
    with torch.no_grad():
        m.weight.fill_(9.0)
    res = s.sync()
    assert not res.committed and s.discarded == 1 and torch.equal(m.weight, torch.full((1, 2), 1.0))
    saved = s.state_dict()
    other = OuterSync(model(0.0), sync("diloco"), TwoReplicas([torch.zeros(1, 2)]))
    other.load_state_dict(saved)
    assert torch.equal(other.anchor[0], torch.full((1, 2), 1.0))


def test_every_step_first_syncs_from_the_first_interval_after_it_and_counts_its_all_reduces() -> None:
    spec = sync("diloco", first=8)
    m = model(1.0)
    s = OuterSync(m, spec, TwoReplicas([torch.full((1, 2), -3.0)]))
    assert [s.every_step(k) for k in range(1, 13)] == [True] * 8 + [False] * 4
    assert [s.due(k) for k in range(1, 17)] == [False] * 11 + [True, False, False, False, True]
    # One all-reduce a step up to step 8, then one per interval (steps 12 and 16).
    counts = [spec.all_reduces(a, b) for a, b in [(1, 16), (5, 13), (9, 11), (9, 12), (7, 6), (1, 8)]]
    assert counts == [10, 5, 0, 1, 0, 8]
    assert sync("localsgd").all_reduces(1, 16) == 4 and sync("every-step").all_reduces(3, 7) == 5


def test_stepping_apart_makes_the_reached_model_the_anchor_with_a_fresh_outer_momentum() -> None:
    # The anchor was the model at step 0 (weight 0); DDP's steps moved every replica to 2.
    m = model(0.0)
    s = OuterSync(m, sync("diloco", first=4, name="nesterov", lr=1.0, momentum=0.5),
                  TwoReplicas([torch.full((1, 2), 1.0)]))  # fmt: skip
    s.sync()  # a momentum buffer from a sync before (a resumed run's saved state)
    assert s.outer is not None and s.outer.state
    with torch.no_grad():
        m.weight.fill_(2.0)
    s.step_apart()
    assert torch.equal(s.anchor[0], torch.full((1, 2), 2.0)) and not s.outer.state
    # This replica moves to 3, the other to 5: mean pseudo-gradient -2, Nesterov's first step 1.5 x 2.
    with torch.no_grad():
        m.weight.fill_(3.0)
    s.averager = TwoReplicas([torch.full((1, 2), -3.0)])
    s.sync()
    assert torch.allclose(m.weight, torch.full((1, 2), 2.0 + 1.5 * 2))


def test_the_forecast_counts_the_sync_once_per_interval() -> None:
    # 1 MB of parameters over a 1 GB/s link: 1 ms per all-reduce at 2 ranks (1.75 ms at 8), once per 50 steps.
    run = summary(step=10.02 * MS, compute=10 * MS, exposed=0.02 * MS, busy=0.02 * MS)
    run["syncEvery"] = 50
    assert measured_from_summary(run, source="run").sync_every == 50
    assert predict(run, Layout(dp=8)) == pytest.approx((10 + 1.75 / 50) * MS)
    every = summary(step=10.02 * MS, compute=10 * MS, exposed=0.02 * MS, busy=0.02 * MS)
    assert predict(every, Layout(dp=8)) > predict(run, Layout(dp=8)) + 0.5 * MS
