"""Parallel modes behind one shape: `apply(model, *, mesh, cfg) -> model` plus a train step.

`data` wraps the model in DDP here; `pipeline` and `hybrid` (pipeline > 1,
tensor = 1) run their own loop (pipeline_train.py) over stages built in
pipeline.py / pipedream.py. The others stop with exit code 2 and a message
saying so (see __main__).
"""

from __future__ import annotations

from torch import nn

from ..config import TrainerConfig
from ..dist_env import DistContext
from . import data as data_parallel
from .data import CommClock, CommTimes, StepResult

IMPLEMENTED = ("data", "pipeline", "hybrid")
PIPELINE_MODES = ("pipeline", "hybrid")


class ModeNotImplemented(RuntimeError):
    def __init__(self, mode: str):
        super().__init__(
            f"mode {mode} is not implemented by this trainer yet (implemented: {', '.join(IMPLEMENTED)})"
        )


def apply(model: nn.Module, *, mesh: DistContext, cfg: TrainerConfig) -> nn.Module:
    """Wrap `model` for cfg.spec.mode."""
    mode = cfg.spec.mode
    if mode == "data":
        return data_parallel.wrap_ddp(model, ctx=mesh, training=cfg.spec.training)
    raise ModeNotImplemented(mode)


def comm_clock_for(model: nn.Module) -> CommClock | None:
    """The communication clock of a wrapped model; None when it does not communicate gradients."""
    if isinstance(model, data_parallel.DDP):
        return CommClock(model)
    return None


def train_step_for(mode: str):  # noqa: ANN201 - returns the mode's train_step function
    if mode == "data":
        return data_parallel.train_step
    raise ModeNotImplemented(mode)


__all__ = [
    "IMPLEMENTED",
    "PIPELINE_MODES",
    "CommClock",
    "CommTimes",
    "ModeNotImplemented",
    "StepResult",
    "apply",
    "comm_clock_for",
    "train_step_for",
]
