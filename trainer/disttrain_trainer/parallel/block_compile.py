"""training.compile: torch.compile per block and for the loss, as torchtitan's `apply_compile` does,
and the clock that keeps compile time apart from training time.

Per block, not the whole model: the blocks of a model are the same code, so one compiled graph
serves all of them (the parameters are graph inputs), the compile takes seconds instead of
growing with the depth, and every wrapper the layouts put around or between blocks keeps
working: pipeline stages hold whole blocks, activation checkpointing cuts between them, FSDP
shards each block as a unit and DDP hooks the gradients.

The order of wrapping (modes/data/layouts.py, modes/pipeline/run_state.py), and why:
  1. float8 (torchao) swaps nn.Linear for Float8Linear on the plain model: the compiled graph
     must trace the float8 casts (inductor fuses them into the neighbouring kernels), and FSDP
     must find float8 weights to all-gather;
  2. tensor parallelism turns the block's weights into DTensors and hooks its linears: compiled
     next, the graph traces the sharded ops and their collectives;
  3. compile each block (`forward` only, in place): the hooks of the modules *around* a block stay
     outside the graph, where they belong (FSDP's all-gather before a block's forward and its
     reduce-scatter after it, the pipeline stage's timing and activation-bytes hooks), and
     parameter names do not change (no `_orig_mod.` prefix), so checkpoints stay interchangeable
     with eager runs;
  4. activation checkpointing runs at forward time around segments of blocks (activation_checkpointing.py):
     the recomputation in backward re-runs the compiled block;
  5. FSDP2 / replicate / DDP last, around the compiled blocks (torchtitan: "apply compile before FSDP").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..process.config import ConfigError
from . import fsdp

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def compile_units(model: nn.Module) -> list[nn.Module]:
    """The blocks compiled one by one: FSDP's units (a `blocks` Sequential's children, a Hugging
    Face model's decoder layers), else the children of an nn.Sequential model."""
    units = fsdp.units(model)
    if not units and isinstance(model, nn.Sequential):
        units = list(model)
    return units


def apply_compile(model: nn.Module, mode: str, *, name: str = "model") -> int:
    """Compile each block's forward in place (see the module docstring for the order); returns
    how many. fullgraph stays off: a user's block may break the graph, which costs speed, not
    correctness."""
    units = compile_units(model)
    if not units:
        raise ConfigError(f"training.compile: model {name!r} has no blocks to compile one by one (a `blocks` "
                          "nn.Sequential, fsdp_units(), or an nn.Sequential model); set training.compile: false")  # fmt: skip
    for unit in units:
        if not getattr(unit, "_disttrain_compiled", False):
            unit.forward = torch.compile(unit.forward, mode=mode)  # type: ignore[method-assign]
            unit._disttrain_compiled = True  # noqa: SLF001 - shared blocks (pipeline) are compiled once
    return len(units)


def loss_mode(mode: str | None, *, tensor_parallel: bool) -> str | None:
    """The loss's compile mode: the blocks' one, but none with tensor parallelism. There the logits
    are vocabulary-sharded DTensors meeting loss_parallel's cross-entropy: in a test process that
    had compiled the same loss for other layouts and shapes before, the compiled loss returned a
    wrong value (3.80 for eager's 3.47) while the compiled blocks stayed exact. The cause is not
    understood, so that loss stays eager (it is a small part of a step)."""
    return None if tensor_parallel else mode


def compile_loss(loss_fn: Loss, mode: str | None) -> Loss:
    """The loss compiled too (torchtitan compiles it beside the blocks): the logits' cast and the
    cross-entropy fuse into one kernel instead of materialising fp32 logits twice."""
    return loss_fn if mode is None else torch.compile(loss_fn, mode=mode)


class CompileClock:
    """Seconds spent compiling and the number of compilations, from torch._dynamo's compile
    callbacks (a frame traced, a backward compiled lazily at its first call, ...).

    The loop reads `take()` once per log interval: the compile seconds of that interval, which
    the steady-state figures leave out, and the compilations started in it: after the warm-up
    interval every one is a recompilation (a guard failed, e.g. a new shape)."""

    def __init__(self) -> None:
        from torch._dynamo.callback import callback_handler  # noqa: PLC0415 - dynamo only with compile on

        self._handler = callback_handler
        self._lock = threading.Lock()
        self._started: float | None = None
        self.seconds = 0.0
        self.count = 0
        self._taken_s, self._taken_n = 0.0, 0
        self._on_start = callback_handler.register_start_callback(self._start)
        self._on_end = callback_handler.register_end_callback(self._end)

    def _start(self, _args: Any) -> None:
        with self._lock:
            self._started = time.perf_counter()
            self.count += 1

    def _end(self, _args: Any) -> None:
        with self._lock:
            if self._started is not None:
                self.seconds += time.perf_counter() - self._started
                self._started = None

    def take(self) -> tuple[float, int]:
        """(seconds, compilations) since the previous take."""
        with self._lock:
            out = (self.seconds - self._taken_s, self.count - self._taken_n)
            self._taken_s, self._taken_n = self.seconds, self.count
        return out

    def close(self) -> None:
        self._handler.remove_start_callback(self._on_start)
        self._handler.remove_end_callback(self._on_end)
