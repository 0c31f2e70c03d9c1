"""Byzantine-robust aggregation over the clients' individual updates.

Coordinate-wise median and trimmed mean (Yin et al. 2018, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates"); Krum and Multi-Krum
(Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant
Gradient Descent"), as Flower's strategy/aggregate.py computes them. Every rule
ignores the sample counts the clients declare: a hostile client chooses its own,
and a weight it chooses would undo the robustness (Multi-Krum averages its
selection with equal weights, as in the paper).

The rules need every update at once: the aggregator keeps n flattened updates
(n x the model's float32 bytes) until the round closes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

Named = list[tuple[str, torch.Tensor]]


def median(x: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of the rows of x (n x d); the mean of the two middle ones for even n."""
    n = x.shape[0]
    s = torch.sort(x, dim=0).values
    if n % 2:
        return s[n // 2].clone()
    return (s[n // 2 - 1] + s[n // 2]) / 2


def trimmed_mean(x: torch.Tensor, fraction: float) -> torch.Tensor:
    """Coordinate-wise mean after cutting floor(fraction x n) values at each end (scipy's trim_mean)."""
    n = x.shape[0]
    k = int(fraction * n)
    if 2 * k >= n:
        raise ValueError(f"trimming {k} of {n} at each end leaves nothing to average")
    s = torch.sort(x, dim=0).values
    return s[k : n - k].mean(dim=0)


def krum_scores(x: torch.Tensor, byzantine: int) -> torch.Tensor:
    """Each row's Krum score: the sum of its squared distances to its n - f - 2 nearest other rows."""
    n = x.shape[0]
    if n < 2 * byzantine + 3:
        raise ValueError(f"Krum with f = {byzantine} needs n > 2f + 2 updates, got {n}")
    closest = n - byzantine - 2
    # float64: a score sums many squared differences, and ties must be real ties.
    d = torch.cdist(x.double(), x.double()).square()
    d.fill_diagonal_(math.inf)  # a row is not its own neighbour
    return torch.sort(d, dim=1).values[:, :closest].sum(dim=1)


def krum_select(x: torch.Tensor, byzantine: int, keep: int) -> list[int]:
    """Indices of the `keep` rows with the lowest scores (ties to the lower index)."""
    scores = krum_scores(x, byzantine)
    order = sorted(range(x.shape[0]), key=lambda i: (float(scores[i]), i))
    return order[:keep]


class RobustAggregation:
    """Collects each answered client's update, flattened; `result()` applies the rule."""

    def __init__(
        self,
        rule: str,
        shapes: list[tuple[str, torch.Size]],
        *,
        trim_fraction: float = 0.1,
        byzantine: int = 1,
        selected: int | None = None,
    ):
        if rule not in ("fedmedian", "trimmedMean", "krum", "multiKrum"):
            raise ValueError(f"unknown robust rule {rule!r}")
        self.rule = rule
        self.shapes = shapes
        self.trim_fraction = trim_fraction
        self.byzantine = byzantine
        self.selected = selected
        self.updates: dict[str, torch.Tensor] = {}
        self.chosen: list[str] = []  # krum / multiKrum: whose updates were used

    def add(self, cid: str, update: Named, weight: float) -> None:
        del weight  # see the module docstring: a client's declared weight is not trusted here
        byname = dict(update)
        self.updates[cid] = torch.cat([byname[n].reshape(-1).float() for n, _ in self.shapes])

    def result(self) -> dict[str, torch.Tensor]:
        if not self.updates:
            raise ValueError("no update to aggregate")
        ids = sorted(self.updates)  # a fixed order: the result does not depend on arrival order
        x = torch.stack([self.updates[c] for c in ids])
        n = len(ids)
        if self.rule == "fedmedian":
            flat = median(x)
        elif self.rule == "trimmedMean":
            flat = trimmed_mean(x, self.trim_fraction)
        else:
            keep = 1 if self.rule == "krum" else min(n, self.selected or n - self.byzantine)
            picked = krum_select(x, self.byzantine, keep)
            self.chosen = [ids[i] for i in picked]
            flat = x[picked].mean(dim=0)
        out: dict[str, torch.Tensor] = {}
        pos = 0
        for name, shape in self.shapes:
            k = math.prod(shape)
            out[name] = flat[pos : pos + k].reshape(shape).clone()
            pos += k
        return out

    def info(self) -> dict[str, Any]:
        return {"robust_chosen": self.chosen} if self.chosen else {}
