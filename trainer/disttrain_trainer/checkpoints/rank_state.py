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

Every part is tensors and plain values (numpy's generator state as a list of ints), encoded with
torch.save and read back weights-only (safe_state.py): a rank never unpickles another pod's bytes.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from . import safe_state

# ----------------------------------------------------------------- RNG streams


def seed_rank(seed: int, step: int, rank: int) -> None:
    """Seed every generator of this process from (seed, step, rank): distinct per rank, reproducible."""
    entropy = np.random.SeedSequence([seed, step, rank]).generate_state(2)
    value = int(entropy[0]) << 32 | int(entropy[1])
    torch.manual_seed(value)  # also every CUDA device
    np.random.seed(int(entropy[0]))
    random.seed(value)


def numpy_state(state: tuple[Any, ...]) -> tuple[Any, ...]:
    """numpy's legacy generator state (name, uint32 keys, pos, has_gauss, cached_gaussian) with the keys
    as a list of ints: a checkpoint holds plain values only (safe_state.py)."""
    name, keys, *rest = state
    return (str(name), [int(k) for k in np.asarray(keys).tolist()], *(v.item() if isinstance(v, np.generic) else v
                                                                       for v in rest))


def numpy_generator_state(state: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    """`numpy_state`'s form back in the form np.random.set_state takes."""
    name, keys, *rest = state
    return (name, np.asarray(keys, dtype=np.uint32), *rest)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": numpy_state(np.random.get_state()),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(numpy_generator_state(state["numpy"]))
    random.setstate(_python_state(state["python"]))
    if (
        "cuda" in state
        and torch.cuda.is_available()
        and len(state["cuda"]) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_state(state: Any) -> tuple[Any, ...]:
    """random.getstate()'s (version, internal state, gauss_next), back from lists to tuples."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


# ------------------------------------------------- gathering every rank's part

# Bytes each rank may contribute to an asynchronous gather: RNG streams encode to ~16 KB
# (torch 5 KB, numpy and python ~3-5 KB each, CUDA a few bytes per device, torch.save's framing).
GATHER_SLOT_BYTES = 64 << 10
_LEN_BYTES = 8


@dataclass
class PendingGather:
    """Every rank's object, on its way to every rank; `result()` waits for it.

    Checkpoints need every rank's RNG streams. Gathering them with `all_gather_object`
    is two collectives the training loop waits for (and unpickles the peers' bytes); instead each
    rank encodes its part (safe_state.dumps)
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
            self.objects = [safe_state.loads(_slot_payload(s), f"rank {r}'s checkpoint part")
                            for r, s in enumerate(self.slots)]  # fmt: skip
            self.slots = self.send = self.work = None
        return self.objects


def _slot_payload(slot: torch.Tensor) -> bytes:
    raw = slot.cpu().numpy().tobytes()
    n = int.from_bytes(raw[:_LEN_BYTES], "little")
    return raw[_LEN_BYTES : _LEN_BYTES + n]


def _slot(data: bytes, size: int) -> torch.Tensor:
    send = torch.zeros(size, dtype=torch.uint8)
    send[:_LEN_BYTES] = torch.frombuffer(bytearray(len(data).to_bytes(_LEN_BYTES, "little")), dtype=torch.uint8)
    if data:
        send[_LEN_BYTES : _LEN_BYTES + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return send


def gather_async(obj: Any, world_size: int, device: torch.device) -> PendingGather:
    """Start gathering `obj` (small: at most GATHER_SLOT_BYTES encoded) from every rank.

    `device` is where the backend's collectives run: NCCL gathers CUDA tensors only."""
    data = safe_state.dumps(obj)
    if len(data) + _LEN_BYTES > GATHER_SLOT_BYTES:
        # Every rank encodes the same kinds of state: when one is too big, all are; the error
        # is the same everywhere instead of a collective of mismatched sizes.
        raise ValueError(f"a rank's part of {len(data)} bytes exceeds the {GATHER_SLOT_BYTES}-byte gather slot")
    send = _slot(data, GATHER_SLOT_BYTES).to(device)
    slots = [torch.empty(GATHER_SLOT_BYTES, dtype=torch.uint8, device=device) for _ in range(world_size)]
    work = dist.all_gather(slots, send, async_op=True)
    return PendingGather(slots=slots, work=work, send=send)


def gather_now(obj: Any, world_size: int, device: torch.device) -> PendingGather:
    """The same gather, completed before returning, for parts of any size (PowerSGD's error
    feedback is model-sized): the sizes first, then every part in a slot of the largest size."""
    data = safe_state.dumps(obj)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
    size = _LEN_BYTES + max(int(s.item()) for s in sizes)
    slots = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(world_size)]
    dist.all_gather(slots, _slot(data, size).to(device))
    return PendingGather(objects=[safe_state.loads(_slot_payload(s), f"rank {r}'s checkpoint part")
                                  for r, s in enumerate(slots)])  # fmt: skip


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
    """This rank's comm-hook state on the CPU, or None for stateless hooks. PowerSGD's numpy
    generator (`rng`) goes as its state (plain values, see numpy_state)."""
    if not isinstance(hook, psgd.PowerSGDState):
        return None
    with _quiet_powersgd():
        state = _to(hook.__getstate__(), torch.device("cpu"))
    if isinstance(state.get("rng"), np.random.RandomState):
        state["rng"] = numpy_state(state["rng"].get_state())
    return state


def load_hook_state(hook: Any, saved: dict[str, Any] | None, device: torch.device) -> None:
    """Put the saved state back into the live hook object (DDP's reducer holds that very object)."""
    if saved is None or not isinstance(hook, psgd.PowerSGDState):
        return
    state = _to(saved, device)
    if isinstance(state.get("rng"), (tuple, list)):
        rng = np.random.RandomState()
        rng.set_state(numpy_generator_state(state["rng"]))
        state["rng"] = rng
    with _quiet_powersgd():
        hook.__setstate__(state)
