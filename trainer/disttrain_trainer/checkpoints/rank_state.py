"""What each rank adds to a checkpoint besides model and optimizer, and how every rank's part
reaches rank 0.

- RNG: every rank's streams (torch, CUDA, numpy, random) are saved; at the same
  world size each rank gets its own back, so dropout continues exactly. At a
  new world size there is no stream to give back, and each rank is seeded from
  (data seed, step, rank): deterministic, and distinct per rank.
- The DDP communication hook's state: PowerSGD keeps per-rank error feedback
  and warm-start factors; without them a resumed run compresses differently
  from an uninterrupted one.
- The gather: every rank's part goes to every rank in one collective, launched
  asynchronously so the loop does not wait for it (`gather_async`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

# ----------------------------------------------------------------- RNG streams


def seed_rank(seed: int, step: int, rank: int) -> None:
    """Seed every generator of this process from (seed, step, rank): distinct per rank, reproducible."""
    entropy = np.random.SeedSequence([seed, step, rank]).generate_state(2)
    value = int(entropy[0]) << 32 | int(entropy[1])
    torch.manual_seed(value)  # also every CUDA device
    np.random.seed(int(entropy[0]))
    random.seed(value)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if (
        "cuda" in state
        and torch.cuda.is_available()
        and len(state["cuda"]) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------- gathering every rank's part

# Bytes each rank may contribute to an asynchronous gather: RNG streams pickle to ~11 KB
# (torch 5 KB, numpy and python ~3 KB each, CUDA a few bytes per device).
GATHER_SLOT_BYTES = 64 << 10
_LEN_BYTES = 8


@dataclass
class PendingGather:
    """Every rank's object, on its way to every rank; `result()` waits for it.

    Checkpoints need every rank's RNG streams. Gathering them with `all_gather_object`
    is two collectives the training loop waits for; instead each rank pickles its part
    into a fixed-size slot and launches one asynchronous all_gather, and the checkpoint
    writer thread waits for it just before writing. Collectives on a group run in the
    order they were issued on every rank, so the loop's next all-reduce pairs up as before."""

    slots: list[torch.Tensor] | None = None  # received slots; None once decoded or when gathered synchronously
    work: Any = None
    send: torch.Tensor | None = None  # kept alive until the collective has read it
    objects: list[Any] | None = None

    def result(self) -> list[Any]:
        if self.objects is None:
            assert self.slots is not None
            self.work.wait()
            self.objects = [pickle.loads(_slot_payload(s)) for s in self.slots]  # noqa: S301 - our own ranks' bytes
            self.slots = self.send = self.work = None
        return self.objects


def _slot_payload(slot: torch.Tensor) -> bytes:
    raw = slot.cpu().numpy().tobytes()
    n = int.from_bytes(raw[:_LEN_BYTES], "little")
    return raw[_LEN_BYTES : _LEN_BYTES + n]


def gather_async(obj: Any, world_size: int, device: torch.device) -> PendingGather:
    """Start gathering `obj` (small: at most GATHER_SLOT_BYTES pickled) from every rank.

    `device` is where the backend's collectives run: NCCL gathers CUDA tensors only."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) + _LEN_BYTES > GATHER_SLOT_BYTES:
        # Every rank pickles the same kinds of state: when one is too big, all are; the error
        # is the same everywhere instead of a collective of mismatched sizes.
        raise ValueError(f"a rank's part of {len(data)} bytes exceeds the {GATHER_SLOT_BYTES}-byte gather slot")
    send = torch.zeros(GATHER_SLOT_BYTES, dtype=torch.uint8)
    send[:_LEN_BYTES] = torch.frombuffer(bytearray(len(data).to_bytes(_LEN_BYTES, "little")), dtype=torch.uint8)
    send[_LEN_BYTES : _LEN_BYTES + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    send = send.to(device)
    slots = [torch.empty(GATHER_SLOT_BYTES, dtype=torch.uint8, device=device) for _ in range(world_size)]
    work = dist.all_gather(slots, send, async_op=True)
    return PendingGather(slots=slots, work=work, send=send)


def gather_now(obj: Any, world_size: int) -> PendingGather:
    """The same gather, completed before returning (for parts of any size; all_gather_object
    picks the backend's device itself)."""
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return PendingGather(objects=out)


# ------------------------------------------------------- communication hook state


@contextlib.contextmanager
def _quiet_powersgd() -> Iterator[None]:
    # PowerSGDState's (de)serialisation logs a warning about the process group on every
    # call; we always restore into the default group, so it is noise in every checkpoint.
    log = logging.getLogger(psgd.__name__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def hook_state(hook: Any) -> dict[str, Any] | None:
    """This rank's comm-hook state on the CPU, or None for stateless hooks."""
    if not isinstance(hook, psgd.PowerSGDState):
        return None
    with _quiet_powersgd():
        return _to(hook.__getstate__(), torch.device("cpu"))


def load_hook_state(hook: Any, saved: dict[str, Any] | None, device: torch.device) -> None:
    """Put the saved state back into the live hook object (DDP's reducer holds that very object)."""
    if saved is None or not isinstance(hook, psgd.PowerSGDState):
        return
    with _quiet_powersgd():
        hook.__setstate__(_to(saved, device))
