"""Central differential privacy for federated averaging (DP-FedAvg, McMahan et al. 2018,
"Learning Differentially Private Recurrent Language Models").

The aggregator scales each client's update to L2 norm at most S = clipNorm, sums
the clipped updates with equal weight, adds Gaussian noise N(0, (z S)^2) to every
coordinate (z = noiseMultiplier) and divides by clientsPerRound: a fixed
denominator (the paper's estimator with uniform weights), so one client moves
the mean by at most S / clientsPerRound whoever else answered. Sample counts are
not used: a weight would raise one client's sensitivity above S.

The unit protected is a client (all of its data). The budget spent so far is
Opacus's RDP accountant over one step per round with sample rate
q = clientsPerRound / clients; the aggregator samples exactly clientsPerRound
without replacement, which the accountant's Poisson-sampling analysis treats as
rate q (the usual approximation, as in Opacus's own data loaders). The noise
comes from a generator seeded with 63 bits from the OS for every round, never
from the job's (public) seed.
"""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from disttrain_api.model import FedPrivacy

Named = list[tuple[str, torch.Tensor]]


def clip(update: Named, clip_norm: float) -> tuple[Named, float]:
    """The update scaled to L2 norm <= clip_norm (over all its tensors), and its norm before."""
    norm = math.sqrt(sum(float(torch.linalg.vector_norm(t.float())) ** 2 for _, t in update))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return [(n, t.float() * scale) for n, t in update], norm


class PrivateMean:
    """Sum of clipped updates; `result()` adds the noise and divides by clientsPerRound."""

    def __init__(
        self,
        shapes: list[tuple[str, torch.Size]],
        privacy: FedPrivacy,
        clients_per_round: int,
        generator: torch.Generator | None = None,
    ):
        self.shapes = shapes
        self.privacy = privacy
        self.denominator = float(clients_per_round)
        self.generator = generator or torch.Generator().manual_seed(secrets.randbits(63))
        self.sums = {n: torch.zeros(s, dtype=torch.float32) for n, s in shapes}
        self.count = 0
        self.clipped = 0  # updates whose norm was above clipNorm

    def add(self, cid: str, update: Named, weight: float) -> None:
        del cid, weight  # equal weights: see the module docstring
        clipped, norm = clip(update, self.privacy.clip_norm)
        for n, t in clipped:
            self.sums[n].add_(t)
        self.count += 1
        self.clipped += int(norm > self.privacy.clip_norm)

    def result(self) -> dict[str, torch.Tensor]:
        if self.count == 0:
            raise ValueError("no update to aggregate")
        std = self.privacy.noise_multiplier * self.privacy.clip_norm
        out = {}
        for n, s in self.sums.items():
            noise = torch.normal(0.0, std, size=s.shape, generator=self.generator)
            out[n] = (s + noise) / self.denominator
        return out

    def info(self) -> dict[str, Any]:
        return {"dp_clipped": self.clipped}


class PrivacyAccountant:
    """The (epsilon, delta) spent so far: Opacus's RDP accountant, one step per published round."""

    def __init__(self, privacy: FedPrivacy, *, clients: int, clients_per_round: int):
        # Imported here: opacus pulls in its whole training stack, which only a private job needs.
        from opacus.accountants import RDPAccountant  # noqa: PLC0415 - opacus (1.4 s), only with central DP

        self.privacy = privacy
        self.sample_rate = clients_per_round / clients
        self.accountant = RDPAccountant()

    def step(self) -> None:
        self.accountant.step(noise_multiplier=self.privacy.noise_multiplier, sample_rate=self.sample_rate)

    @property
    def steps(self) -> int:
        return sum(int(h[2]) for h in self.accountant.history)

    def epsilon(self) -> float:
        if not self.accountant.history:
            return 0.0
        return float(self.accountant.get_epsilon(delta=self.privacy.delta))

    def report(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon(), "delta": self.privacy.delta,
                "noiseMultiplier": self.privacy.noise_multiplier, "clipNorm": self.privacy.clip_norm,
                "sampleRate": self.sample_rate, "rounds": self.steps}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"history": [tuple(h) for h in self.accountant.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.history = [tuple(h) for h in state.get("history", [])]
