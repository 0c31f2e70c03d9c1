"""The clock of a pipeline stage's compute intervals, and their exchange between ranks once per
log interval.

Clock: on a CPU an interval is two host clock reads (`time.time()`: shared by the processes of
a machine, NTP-synchronised across machines), as the work runs on the host. On a GPU the host
only queues kernels, and two host reads around a forward would measure its launch; so each
interval is a pair of CUDA events on the stage's stream, resolved once per log interval to the
host's time base: the interval's reference event is recorded right after the device was synchronised
(its queue empty, so the event runs at the host time read beside it) and every later event is
that time plus the GPU's elapsed time since the reference.

Exchange: stage_times.split_idle needs every rank's timeline of a step. Instead of an
all_gather_object per step (pickling, and every rank waiting for every other each step), each
rank keeps its steps' intervals and sends them all in one tensor all-gather at the end of the
log interval: float64 rows [kind, stage, micro-batch, start, end], padded to the most intervals
a rank can have in a step, so the figures are the very floats the per-step exchange carried.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .stage_times import Interval

KINDS = ("F", "B", "W")
ROW = 5  # kind, stage, micro-batch, start, end
HEAD = 4  # data-parallel rank, tensor-parallel rank, loss (nan: none), intervals
Token = Any  # a host time (float) or a CUDA event


class StageClock:
    """Host clock reads on a CPU, CUDA events on a GPU (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._ref: Any = None
        self._ref_host = 0.0

    def start_interval(self) -> None:
        """Call with the device idle (synchronised): the reference of this log interval's events."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()
            self._ref_host = time_now()

    def mark(self) -> Token:
        if not self.cuda:
            return time_now()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, token: Token) -> float:
        """A token as host time (after the device finished the interval's work)."""
        if not self.cuda:
            return float(token)
        return self._ref_host + self._ref.elapsed_time(token) / 1000.0


def time_now() -> float:
    return time.time()


@dataclass(frozen=True, kw_only=True)
class RankStep:
    """One rank's part of one step, as the exchange delivers it."""

    dp_rank: int
    tp_rank: int
    loss: float | None
    intervals: list[Interval]


def capacity(microbatches: int, stages_per_rank: int) -> int:
    """The most intervals a rank records in a step: F, B and W of every micro-batch on each of its stages."""
    return len(KINDS) * microbatches * stages_per_rank


def pack(dp_rank: int, tp_rank: int, loss: float | None, intervals: Sequence[Interval], cap: int) -> torch.Tensor:
    if len(intervals) > cap:
        raise ValueError(f"{len(intervals)} intervals in a step, more than the {cap} a rank can have")
    row = torch.full((HEAD + ROW * cap,), float("nan"), dtype=torch.float64)
    row[:HEAD] = torch.tensor([dp_rank, tp_rank, float("nan") if loss is None else loss, len(intervals)],
                              dtype=torch.float64)  # fmt: skip
    if intervals:
        row[HEAD : HEAD + ROW * len(intervals)] = torch.tensor(
            [[KINDS.index(k), s, m, t0, t1] for k, s, m, t0, t1 in intervals], dtype=torch.float64
        ).reshape(-1)
    return row


def unpack(row: torch.Tensor) -> RankStep:
    vals = row.tolist()
    n = int(vals[3])
    body = vals[HEAD : HEAD + ROW * n]
    ivs = [(KINDS[int(body[i])], int(body[i + 1]), int(body[i + 2]), body[i + 3], body[i + 4])
           for i in range(0, len(body), ROW)]  # fmt: skip
    return RankStep(dp_rank=int(vals[0]), tp_rank=int(vals[1]), loss=None if math.isnan(vals[2]) else vals[2],
                    intervals=ivs)  # fmt: skip


def exchange(rows: Sequence[torch.Tensor], *, world_size: int, device: torch.device) -> list[list[RankStep]]:
    """Every rank's steps of this log interval: result[step][rank] (collective: every rank calls
    it after the same steps). One all-gather of a [steps, width] float64 tensor."""
    mine = torch.stack(list(rows)).to(device)
    every = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    host = [t.cpu() for t in every]
    return [[unpack(host[r][s]) for r in range(world_size)] for s in range(len(rows))]
