"""What a resumed rank needs besides model and optimizer: the agreed checkpoint, RNG streams, hook state.

- The checkpoint: rank 0 claims the checkpoint directory for this gang's
  restart attempt (checkpoint_fence.py: a writer of a replaced gang is fenced
  off from then on), then picks the newest checkpoint that is complete *and
  loads*, and broadcasts its step; every other rank loads exactly that step.
  An unreadable one is moved aside (`step-N.corrupt`), so the whole gang falls
  back to the previous one together. When the caller can take a sharded (DCP)
  checkpoint and the newest good one is one, rank 0 verifies it
  (sharded_checkpoint.verify) and names it instead: every rank reads its own
  shards of it; a load that still fails on it (`reject`) moves it aside too.
- RNG: every rank's streams (torch, CUDA, numpy, random) are saved; at the same
  world size each rank gets its own back, so dropout continues exactly. At a
  new world size there is no stream to give back, and each rank is seeded from
  (data seed, step, rank): deterministic, and distinct per rank.
- The DDP communication hook's state: PowerSGD keeps per-rank error feedback
  and warm-start factors; without them a resumed run compresses differently
  from an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from . import checkpoint as ckpt
from . import checkpoint_dir as cdir
from . import checkpoint_fence as fence
from . import sharded_checkpoint as sharded_ckpt
from .dist_env import DistContext


class CheckpointNotVisible(RuntimeError):
    """Rank 0 loaded a checkpoint this rank cannot read yet; transient (the shared volume may lag)."""


def agree_on_checkpoint(
    root: Path, ctx: DistContext, *, writer: fence.Writer, sharded: bool = False
) -> tuple[int, dict[str, Any] | Path] | None:
    """The newest checkpoint that rank 0 can load completely, loaded on every rank; None: start fresh.

    Rank 0 first takes the directory over as `writer` (raises checkpoint_fence.Fenced when a newer
    attempt claimed it). With `sharded`, a verified DCP checkpoint newer than every good full one
    comes back as its path: every rank then reads its own shards of it (sharded_checkpoint.load).
    One broadcast either way, so every rank issues the same collectives whatever it finds on its volume."""
    loaded: tuple[int, dict[str, Any] | Path] | None = None
    refused = ""
    if ctx.is_main:
        try:
            cdir.take_over(root, writer)
            loaded = _pick(root, sharded=sharded)
        except fence.Fenced as e:
            refused = str(e)
    choice = [refused or ((loaded[0], isinstance(loaded[1], Path)) if loaded is not None else None)]
    dist.broadcast_object_list(choice, src=0)
    if isinstance(choice[0], str):
        raise fence.Fenced(choice[0])
    if choice[0] is None:
        return None
    step, is_dcp = choice[0]
    if is_dcp:
        return step, root / ckpt.name_for(step)
    if loaded is None:
        try:
            loaded = step, ckpt.load(root, step)
        except Exception as e:  # noqa: BLE001 - any read error here is the volume's, not the job's
            raise CheckpointNotVisible(
                f"rank {ctx.rank} cannot read checkpoint step {step} under {root} that rank 0 "
                f"loaded ({e}); the checkpoint volume must be shared by all workers"
            ) from None
    return loaded


def _pick(root: Path, *, sharded: bool) -> tuple[int, dict[str, Any] | Path] | None:
    """Rank 0: the newest checkpoint that loads (full) or verifies (DCP, with `sharded`); the ones
    in between are moved aside. Without `sharded` DCP checkpoints are not candidates."""
    if not sharded:
        return ckpt.load_latest(root)
    for step, path in reversed(sharded_ckpt.list_checkpoints(root)):
        if sharded_ckpt.is_sharded_checkpoint(path):
            problem = sharded_ckpt.verify(path)
            if problem is None:
                return step, path
            cdir.quarantine(path, problem)
            continue
        try:
            return step, ckpt.load(root, step)
        except Exception as e:  # noqa: BLE001 - a damaged file must not stop the job; an older one may load
            cdir.quarantine(path, f"{type(e).__name__}: {e}")
    return None


def reject(path: Path, ctx: DistContext, error: BaseException) -> None:
    """Every rank failed to load the agreed DCP checkpoint `path` (DCP raises a read error on all
    ranks alike): rank 0 moves it aside, so the next agree_on_checkpoint picks the one before."""
    if ctx.is_main:
        cdir.quarantine(path, f"{type(error).__name__}: {str(error).strip()[:300]}")
    dist.barrier()


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
