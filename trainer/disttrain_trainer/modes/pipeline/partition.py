"""Split ordered blocks into pipeline stages: uniform, by parameters, or by profile (PipeDream's planner).

`profile` measures each block's forward+backward time and output activation
size on one micro-batch, then chooses contiguous stages by dynamic programming
so that the slowest stage is as fast as possible. A stage's time is its
compute plus the transfer of its output activation to the next stage and of
that activation's gradient back (2 x bytes / bandwidth; the last stage sends
nothing). The pipeline runs at the pace of its slowest stage, so minimising
the maximum is what balances it (Narayanan et al. 2019, section 3.1).

Everything here except `profile_blocks` is pure arithmetic and unit-tested.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from disttrain_api.scaling.pipeline_time import min_max_split
from torch import nn

PROFILE_REPS = 5


@dataclass(frozen=True, kw_only=True)
class BlockProfile:
    seconds: float  # forward + backward of one micro-batch (fastest of PROFILE_REPS)
    out_bytes: int  # output activation of one micro-batch
    params: int


@dataclass(frozen=True, kw_only=True)
class Plan:
    method: str
    bounds: tuple[tuple[int, int], ...]  # stage -> [first block, end block)
    stage_seconds: tuple[float, ...]  # predicted time per stage per micro-batch (compute + transfer)

    @property
    def stages(self) -> int:
        return len(self.bounds)

    @property
    def max_seconds(self) -> float:
        return max(self.stage_seconds)

    @property
    def imbalance(self) -> float:
        """Slowest stage / mean stage: 1.0 is perfectly balanced."""
        mean = sum(self.stage_seconds) / len(self.stage_seconds)
        return self.max_seconds / mean if mean > 0 else 1.0

    def blocks_of(self, stage: int) -> range:
        return range(*self.bounds[stage])

    def describe(self) -> str:
        parts = [
            f"stage {s}: blocks {a}-{b - 1} ({t * 1e3:.2f} ms)"
            for s, ((a, b), t) in enumerate(zip(self.bounds, self.stage_seconds, strict=True))
        ]
        return f"partition {self.method}: " + "; ".join(parts) + f"; imbalance {self.imbalance:.2f}"

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "stages": [
                {"blocks": [a, b - 1], "predictedSeconds": t}
                for (a, b), t in zip(self.bounds, self.stage_seconds, strict=True)
            ],
            "imbalance": self.imbalance,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(
            method=d["method"],
            bounds=tuple((s["blocks"][0], s["blocks"][1] + 1) for s in d["stages"]),
            stage_seconds=tuple(float(s["predictedSeconds"]) for s in d["stages"]),
        )


def stage_seconds(
    bounds: Sequence[tuple[int, int]], costs: Sequence[float], out_bytes: Sequence[int], bytes_per_s: float
) -> tuple[float, ...]:
    n = len(costs)
    return tuple(
        sum(costs[a:b]) + (_transfer(out_bytes[b - 1], bytes_per_s) if b < n else 0.0) for a, b in bounds
    )


def _transfer(nbytes: int, bytes_per_s: float) -> float:
    return 2.0 * nbytes / bytes_per_s if bytes_per_s > 0 else 0.0


def _check(n: int, stages: int) -> None:
    if stages < 1 or n < stages:
        raise ValueError(f"cannot split {n} blocks into {stages} stages: every stage needs at least one block")


def uniform_bounds(n: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Equal block counts; the first n % stages stages get one more."""
    _check(n, stages)
    q, r = divmod(n, stages)
    out, a = [], 0
    for s in range(stages):
        b = a + q + (1 if s < r else 0)
        out.append((a, b))
        a = b
    return tuple(out)


def min_max_bounds(
    costs: Sequence[float], stages: int, *, out_bytes: Sequence[int] | None = None, bytes_per_s: float = 0.0
) -> tuple[tuple[int, int], ...]:
    """Contiguous split into exactly `stages` non-empty stages minimising the slowest stage.

    A stage pays for sending its last block's output on (`out_bytes` at `bytes_per_s`). The
    dynamic programme is the scaling forecast's (`pipeline_time.min_max_split`): one partitioner
    for the stages the trainer builds and the ones the forecast predicts.
    """
    n = len(costs)
    _check(n, stages)
    ob = list(out_bytes) if out_bytes is not None else [0] * n
    cut_cost = [_transfer(b, bytes_per_s) for b in ob]
    return tuple(min_max_split(costs, stages, cut_cost=cut_cost))


def make_plan(
    method: str, profiles: Sequence[BlockProfile], stages: int, *, bytes_per_s: float
) -> Plan:
    costs = [p.seconds for p in profiles]
    out_bytes = [p.out_bytes for p in profiles]
    if method == "uniform":
        bounds = uniform_bounds(len(profiles), stages)
    elif method == "params":
        bounds = min_max_bounds([float(p.params) for p in profiles], stages)
    elif method == "profile":
        bounds = min_max_bounds(costs, stages, out_bytes=out_bytes, bytes_per_s=bytes_per_s)
    else:
        raise ValueError(f"unknown partition {method!r}: uniform, params or profile")
    return Plan(method=method, bounds=bounds, stage_seconds=stage_seconds(bounds, costs, out_bytes, bytes_per_s))


def _clock(device: torch.device) -> float:
    """GPU: wall time after a sync. CPU: this thread's CPU time, which a machine shared with
    other processes does not inflate the way preemption inflates wall time (the profile runs
    with one intra-op thread, so the thread's CPU time is the block's whole cost)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.thread_time()


def profile_blocks(
    blocks: Sequence[nn.Module],
    sample: torch.Tensor,
    *,
    reps: int = PROFILE_REPS,
    clock: Callable[[torch.device], float] = _clock,
) -> list[BlockProfile]:
    """Forward+backward time and output size of each block on `sample` (one micro-batch).

    Each block gets the previous block's real output (detached, so its backward stops at
    its own input). The repetitions go round all blocks in turn, so a burst of load from
    other processes (or a thread pool waking up) hits every block alike, and the fastest
    run of each block is kept: interference only ever adds time.
    """
    device = sample.device
    inputs, outputs = [], []
    x = sample
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        best = _profile_rounds(blocks, x, reps, clock, inputs, outputs)
    finally:
        torch.set_num_threads(threads)
    for block in blocks:
        block.zero_grad(set_to_none=True)
    return [
        BlockProfile(
            seconds=best[k],
            out_bytes=outputs[k].numel() * outputs[k].element_size(),
            params=sum(p.numel() for p in block.parameters()),
        )
        for k, block in enumerate(blocks)
    ]


def _profile_rounds(
    blocks: Sequence[nn.Module],
    x: torch.Tensor,
    reps: int,
    clock: Callable[[torch.device], float],
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
) -> list[float]:
    device = x.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for block in blocks:  # one plain pass: the real inputs, and a warm-up
            inputs.append(x.detach().requires_grad_(x.is_floating_point()))
            x = block(inputs[-1]).detach()
            outputs.append(x)
        best = [float("inf")] * len(blocks)
        for rep in range(reps + 1):  # round 0 is a warm-up of the backward too
            for k, block in enumerate(blocks):
                t0 = clock(device)
                y = block(inputs[k])
                if y.requires_grad:
                    torch.autograd.backward(y, torch.ones_like(y))
                if rep:
                    best[k] = min(best[k], clock(device) - t0)
    return best
