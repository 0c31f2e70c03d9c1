"""The state of one round attempt at the aggregator, including the secure-aggregation stages.

A round may take several attempts: one that cannot be published (fewer than
minAnsweredClients updates, too few shares to unmask, an unmasked weight that
is not the survivors' total) is abandoned whole, counted with its reason, and
the round is sampled again. Updates name the round and attempt they answer, so
a late or replayed one from an earlier attempt is refused, never mixed into a
later sum.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from ...tensor_transport.protos import tensor_transport_pb2 as pb
from .strategy import Aggregation


class Abandoned(Exception):
    """A round attempt that must not be published; `reason` labels the counter."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class SecureStage:
    """What the aggregator relays and collects for one secure round (Bonawitz et al.).

    U1 = `keys` (advertised), U2 = `sharers` (shares received: the peers every masked input is
    masked against), U3 = the attempt's `answered` (masked inputs received), and the reveals.
    """

    min_answered: int
    threshold: int = 0  # Shamir t; fixed from |U1| when the key stage closes, as the clients compute it
    keys: dict[str, pb.PublicKeys] = field(default_factory=dict)  # U1 once closed
    keys_closed: asyncio.Event = field(default_factory=asyncio.Event)
    keys_all: asyncio.Event = field(default_factory=asyncio.Event)
    # recipient -> sender -> sealed share: a retried ShareKeys replaces, never duplicates
    shares: dict[str, dict[str, pb.EncryptedShare]] = field(default_factory=dict)
    sharers: set[str] = field(default_factory=set)  # U2 once closed
    shares_closed: asyncio.Event = field(default_factory=asyncio.Event)
    shares_all: asyncio.Event = field(default_factory=asyncio.Event)
    masked_sum: np.ndarray | None = None  # uint64, wrapping
    weights: dict[str, float] = field(default_factory=dict)  # n_u each masked input declared
    plan: pb.UnmaskPlan | None = None
    plan_ready: asyncio.Event = field(default_factory=asyncio.Event)
    reveals: dict[str, list[pb.RevealedShare]] = field(default_factory=dict)
    reveals_all: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False

    def abort(self) -> None:
        self.aborted = True
        for ev in (self.keys_closed, self.shares_closed, self.plan_ready, self.keys_all, self.shares_all, self.reveals_all):
            ev.set()


@dataclass
class RoundAttempt:
    round: int  # the round being played, 1-based
    attempt: int  # global attempt counter: unique per sample
    sampled: list[str]
    model_chunks: list[pb.Chunk]
    deadline: float  # time.monotonic()
    total: Aggregation | None
    secure: SecureStage | None = None
    served: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    samples: float = 0.0
    client_compute_s: dict[str, float] = field(default_factory=dict)
    client_comm_s: dict[str, float] = field(default_factory=dict)
    client_data_s: dict[str, float] = field(default_factory=dict)
    client_loss: dict[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    open: bool = True
    started: float = field(default_factory=time.monotonic)
    all_answered: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def round_id(self) -> str:
        return f"{self.round}.{self.attempt}"

    def expected_answers(self) -> int:
        if self.secure is not None and self.secure.shares_closed.is_set():
            return len(self.secure.sharers)
        return len(self.sampled)

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` at most `timeout` seconds; whether it is set."""
    try:
        await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
        return True
    except TimeoutError:
        return event.is_set()
