"""Server-side aggregation: one round's aggregate update, then a server step.

Following Flower's strategy/aggregate.py: FedAvg and FedProx average the
clients' updates weighted by their sample counts (McMahan et al. 2017; FedProx,
Li et al. 2020, differs only on the clients); FedAdam treats the mean update as
a pseudo-gradient for Adam on the server (Reddi et al. 2021, "Adaptive
Federated Optimization"). For these the aggregator keeps a running weighted sum
as updates arrive, so aggregation needs no list of all updates in memory. The
Byzantine-robust rules (robust.py) and central differential privacy
(privacy.py) aggregate differently; `make_aggregation` picks one per round.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from disttrain_api.model import ROBUST_STRATEGIES, FederatedSpec

from .privacy import PrivateMean
from .robust import RobustAggregation

Named = list[tuple[str, torch.Tensor]]

# Reddi et al. 2021 defaults; tau bounds the step where the second moment is tiny.
ADAM_BETA1 = 0.9
ADAM_BETA2 = 0.99
ADAM_TAU = 1e-3


class WeightedSum:
    """Running sum of n_i * update_i and of n_i."""

    def __init__(self, shapes: list[tuple[str, torch.Size]], reuse: dict[str, torch.Tensor] | None = None):
        self.shapes = dict(shapes)
        self.sums: dict[str, torch.Tensor] = {}  # filled by the first update: no pass over zeros
        # The previous round's sums: overwritten, so no new model-sized memory each round.
        self._reuse = reuse or {}
        self.weight = 0.0
        self.count = 0

    def add(self, update: Named, weight: float) -> None:
        for n, t in update:
            if n not in self.sums:
                out = self._reuse.get(n)
                if out is None or out.shape != t.shape:
                    out = torch.empty(t.shape, dtype=torch.float32)
                self.sums[n] = torch.mul(t, weight, out=out)
            else:
                self.sums[n].add_(t, alpha=weight)
        self.weight += weight
        self.count += 1

    def mean(self) -> dict[str, torch.Tensor]:
        if self.weight <= 0:
            raise ValueError("no update to average")
        return {n: self.sums[n] / self.weight for n in self.shapes}


class Aggregation(Protocol):
    """One round's aggregate: updates go in as they are accepted; `result()` when the round closes."""

    def add(self, cid: str, update: Named, weight: float) -> None: ...

    def result(self) -> dict[str, torch.Tensor]:
        """The aggregate update; ValueError when the collected updates do not allow one."""
        ...

    def info(self) -> dict[str, Any]:
        """What the round record should say about this aggregation."""
        ...


class WeightedMean:
    """fedavg / fedprox / fedadam: the sample-weighted mean, as a running sum."""

    def __init__(self, shapes: list[tuple[str, torch.Size]], reuse: dict[str, torch.Tensor] | None = None):
        self.sum = WeightedSum(shapes, reuse)

    def add(self, cid: str, update: Named, weight: float) -> None:
        self.sum.add(update, weight)

    def result(self) -> dict[str, torch.Tensor]:
        return self.sum.mean()

    def info(self) -> dict[str, Any]:
        return {}


def make_aggregation(
    fed: FederatedSpec, shapes: list[tuple[str, torch.Size]], reuse: dict[str, torch.Tensor] | None = None
) -> Aggregation:
    if fed.privacy is not None:
        return PrivateMean(shapes, fed.privacy, fed.clients_per_round)
    if fed.strategy in ROBUST_STRATEGIES:
        return RobustAggregation(fed.strategy, shapes, trim_fraction=fed.trim_fraction,
                                 byzantine=fed.byzantine_clients, selected=fed.multi_krum_selected)  # fmt: skip
    return WeightedMean(shapes, reuse)


class ServerStep:
    """Moves the global model by the mean update; owns the server optimizer state (FedAdam)."""

    def __init__(self, strategy: str, lr: float):
        self.strategy = strategy
        self.lr = lr
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}

    def apply(self, model: dict[str, torch.Tensor], mean: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, delta in mean.items():
                p = model[n]
                if self.strategy != "fedadam" or not p.is_floating_point():
                    p.add_(delta.to(p.dtype), alpha=self.lr)
                    continue
                m = self.m.setdefault(n, torch.zeros_like(delta))
                v = self.v.setdefault(n, torch.zeros_like(delta))
                m.mul_(ADAM_BETA1).add_(delta, alpha=1 - ADAM_BETA1)
                v.mul_(ADAM_BETA2).addcmul_(delta, delta, value=1 - ADAM_BETA2)
                p.add_((m / (v.sqrt() + ADAM_TAU)).to(p.dtype), alpha=self.lr)

    def state_dict(self) -> dict[str, Any]:
        return {"m": self.m, "v": self.v}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m = dict(state.get("m", {}))
        self.v = dict(state.get("v", {}))
