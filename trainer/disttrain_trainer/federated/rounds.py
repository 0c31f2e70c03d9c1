"""The state of one round attempt at the aggregator, including the secure-aggregation stages.

A round may take several attempts: one that closes with fewer than
minAnsweredClients updates is dropped whole and the round is sampled again.
Updates name the round and attempt they answer, so a late or replayed one
from an earlier attempt is refused, never mixed into a later sum.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from ..tensor_transport.protos import tensor_transport_pb2 as pb
from .strategy import WeightedSum


@dataclass
class SecureStage:
    """What the aggregator relays and collects for one secure round (Bonawitz et al.)."""

    threshold: int
    keys: dict[str, pb.PublicKeys] = field(default_factory=dict)  # U1 once closed
    keys_closed: asyncio.Event = field(default_factory=asyncio.Event)
    keys_all: asyncio.Event = field(default_factory=asyncio.Event)
    shares: dict[str, list[pb.EncryptedShare]] = field(default_factory=dict)  # by recipient
    sharers: set[str] = field(default_factory=set)  # U2 once closed
    shares_closed: asyncio.Event = field(default_factory=asyncio.Event)
    shares_all: asyncio.Event = field(default_factory=asyncio.Event)
    masked_sum: np.ndarray | None = None  # uint64, wrapping
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
    total: WeightedSum | None
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
