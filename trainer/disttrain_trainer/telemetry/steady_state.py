"""The summary's steady-state throughput, compile time and peak device memory per rank.

The whole-run figures (samplesPerS, tokensPerS, mfu) average every step, the first ones too:
allocation, DDP's bucket rebuild and, with training.compile, the compilation itself. The steady
state is what a longer run converges to: the log intervals after the process's first (the same
windows the scaling forecast reads, telemetry/scaling_record.py), with the seconds spent
compiling in them (a recompilation) taken out. Without a second interval (a run of a single log
interval) there is no steady state and the fields are left out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from disttrain_api.model import JobSpec

from ..parallel.block_compile import CompileClock
from .model_flops import throughput_fields
from .step_metrics import Tally


class CompileRecord:
    """Per process: the compile clock (None: compile off) and the compile time and compilations
    per log interval; the first interval is the warm-up, a compilation after it a recompilation."""

    def __init__(self, mode: str | None) -> None:
        self.mode = mode
        self.clock = CompileClock() if mode is not None else None
        self.recompiles = 0
        self.steady_s = 0.0  # compile seconds inside the steady-state windows
        self._intervals = 0

    def interval(self) -> None:
        """A log interval ended (call it where the steady-state tally takes the interval)."""
        self._intervals += 1
        if self.clock is None:
            return
        seconds, count = self.clock.take()
        if self._intervals > 1:
            self.recompiles += count
            self.steady_s += seconds

    def fields(self) -> dict[str, Any]:
        if self.clock is None:
            return {}
        return {"compile": self.mode, "compileS": self.clock.seconds, "recompiles": self.recompiles}

    def close(self) -> None:
        if self.clock is not None:
            self.clock.close()


def steady_fields(steady: Tally, compile_s: float, *, spec: JobSpec, vocab: int, dp: int, device: torch.device,
                  accelerators: int) -> dict[str, Any]:  # fmt: skip
    """steadySamplesPerS and, for a GPT, steadyTokensPerS and steadyMfu (absent without a steady state)."""
    seconds = steady.step_s - compile_s
    if steady.steps == 0 or seconds <= 0:
        return {}
    samples_per_s = steady.samples * dp / seconds
    out: dict[str, Any] = {"steadySamplesPerS": samples_per_s}
    tp = throughput_fields(spec, vocab=vocab, samples_per_s=samples_per_s, device=device, accelerators=accelerators)
    if "tokensPerS" in tp:
        out["steadyTokensPerS"] = tp["tokensPerS"]
    if "mfu" in tp:
        out["steadyMfu"] = tp["mfu"]
    return out


def peak_memory_per_rank(device: torch.device, world_size: int) -> list[int] | None:
    """Every rank's peak of allocated device memory in bytes (collective on a GPU: all ranks call
    it; None on a CPU, where the process's memory is not the model's alone)."""
    if device.type != "cuda":
        return None
    mine = torch.tensor([torch.cuda.max_memory_allocated(device)], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]
