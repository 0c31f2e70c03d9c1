"""Central differential privacy for federated averaging (DP-FedAvg, McMahan et al. 2018,
"Learning Differentially Private Recurrent Language Models").

The aggregator scales each client's update to L2 norm at most S = clipNorm (a non-finite update
becomes zero: it is refused nowhere, so no refusal leaks), sums the clipped updates with equal
weight, adds Gaussian noise N(0, (z S)^2) to every coordinate (z = noiseMultiplier) and divides by
clientsPerRound: a fixed denominator (the paper's estimator with uniform weights, q x clients),
so one client moves the mean by at most S / clientsPerRound whoever else answered. Sample counts
are not used: a weight would raise one client's sensitivity above S.

The unit protected is a client (all of its rows), under add/remove-one-client adjacency. Each
round attempt is the Sampled Gaussian Mechanism: every one of `clients` is sampled independently
with probability q = clientsPerRound / clients (Poisson sampling, sampling.py, from draws only the
aggregator can compute), and every attempt is published, however many answered (none: the step
is noise alone). That is what Opacus's RDP accountant analyses (Mironov, Talwar and Zhang 2019),
one step per published round at rate q. A sampled client that does not answer contributes
nothing, which can only lower its privacy loss. The noise comes from a generator seeded with 63
bits from the OS for every round, never from the job's (public) seed.
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
    """The update scaled to L2 norm <= clip_norm (over all its tensors), and its norm before; a
    non-finite update (NaN or Inf anywhere) becomes zero, also a clipped update."""
    # float64: a large finite float32 update must not overflow to an infinite norm.
    norm = math.sqrt(sum(float(torch.linalg.vector_norm(t.double())) ** 2 for _, t in update))
    if not math.isfinite(norm):
        return [(n, torch.zeros(t.shape, dtype=torch.float32)) for n, t in update], norm
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

    def add(self, cid: str, update: Named, weight: float) -> None:
        del cid, weight  # equal weights: see the module docstring
        clipped, _ = clip(update, self.privacy.clip_norm)
        for n, t in clipped:
            self.sums[n].add_(t)

    def result(self) -> dict[str, torch.Tensor]:
        """The noised mean, whoever answered (no one: noise alone; see the module docstring)."""
        std = self.privacy.noise_multiplier * self.privacy.clip_norm
        out = {}
        for n, s in self.sums.items():
            noise = torch.normal(0.0, std, size=s.shape, generator=self.generator)
            out[n] = (s + noise) / self.denominator
        return out

    def info(self) -> dict[str, Any]:
        return {}  # how many updates were clipped is one client's fact per update: not released


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
                "sampleRate": self.sample_rate, "sampling": "poisson", "unit": "client",
                "rounds": self.steps}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"history": [tuple(h) for h in self.accountant.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.history = [tuple(h) for h in state.get("history", [])]
