"""Synchronous pipeline parallelism on torch.distributed.pipelining.

The model's ordered blocks (blocks.py) are cut into stages by a plan
(partition.py); each rank of a pipeline group builds a `PipelineStage` per
stage it holds and drives one of PyTorch's schedules:

  Naive                  GPipe with one micro-batch: the batch passes the stages in turn
                         (the model-parallel baseline: p - 1 of p stages always idle);
  GPipe                  all forwards, then all backwards (Huang et al. 2019);
  1F1B                   one forward one backward: at most p micro-batches in flight (PipeDream-flush);
  Interleaved1F1B        v stages per rank, looped placement (Narayanan et al. 2021);
  InterleavedZeroBubble  ZB1P: weight gradients deferred into the bubble (Qi et al. 2024);
  ZBVZeroBubble          the V-shaped zero-bubble variant: exactly two stages per rank.

Stage modules are subclassed only to observe them: each forward/backward of a
micro-batch is timed (host clock on a CPU, CUDA events on a GPU: timeline.py;
stage_times.py splits the rest of the step into p2p and bubble) and the bytes
autograd saves for it are counted, so the peak of activation memory held at
once is measured, not computed from the schedule.

With tensor parallelism inside a pipeline, `shard_stage` shards each stage
module over the tensor-parallel mesh before its PipelineStage is built (the
group is then this tensor index's pipeline, mesh["pp"]); the schedule runs
inside `loss_parallel` so a vocabulary-sharded last stage meets a
vocabulary-parallel cross-entropy, forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from .partition import Plan
from .timeline import StageClock, Token

SCHEDULE_CLASSES: dict[str, type] = {
    "Naive": ScheduleGPipe,
    "GPipe": ScheduleGPipe,
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
}
MULTI_STAGE = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def total_stages(schedule: str, pp: int, virtual: int) -> int:
    return pp * (virtual if schedule in MULTI_STAGE else 1)


def stage_indices(schedule: str, pp_rank: int, pp: int, virtual: int) -> list[int]:
    """Global stage indices held by pipeline rank `pp_rank`: looped (r, r + p, ...) or V-shaped."""
    if schedule == "ZBVZeroBubble":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    if schedule in MULTI_STAGE:
        return [pp_rank + k * pp for k in range(virtual)]
    return [pp_rank]


def microbatches_for(schedule: str, microbatches: int) -> int:
    return 1 if schedule == "Naive" else microbatches


@dataclass
class Recorder:
    """This rank's compute intervals of one step (clock tokens: timeline.py) and the activation bytes it holds."""

    clock: StageClock = field(default_factory=lambda: StageClock(torch.device("cpu")))
    intervals: list[tuple[str, int, int, Token, Token]] = field(default_factory=list)
    held: dict[tuple[int, int], int] = field(default_factory=dict)
    peak_bytes: int = 0

    def reset(self) -> None:
        self.intervals.clear()
        self.held.clear()
        self.peak_bytes = 0

    def hold(self, key: tuple[int, int], nbytes: int) -> None:
        self.held[key] = nbytes
        self.peak_bytes = max(self.peak_bytes, sum(self.held.values()))

    def release(self, key: tuple[int, int]) -> None:
        self.held.pop(key, None)


class SavedBytes:
    """saved_tensors_hooks that add up the distinct non-parameter tensors autograd keeps.

    A tensor counts its own bytes, not its storage's: a micro-batch is a view of the
    whole batch and holds only its rows. The same tensor saved twice counts once."""

    def __init__(self, params: set[int]):
        self.params, self.seen, self.nbytes = params, set(), 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        local = _local(t)  # a DTensor's bytes on this rank are its shard's
        key = (local.data_ptr(), local.numel())
        if local.untyped_storage().data_ptr() not in self.params and key not in self.seen:
            self.seen.add(key)
            self.nbytes += local.numel() * local.element_size()
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class TimedStage(PipelineStage):
    """A PipelineStage that records its compute intervals and held activation bytes."""

    def __init__(self, *args: Any, recorder: Recorder, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.recorder = recorder
        self._param_ptrs = {_local(p).untyped_storage().data_ptr() for p in self.submod.parameters()}

    def forward_one_chunk(self, fwd_chunk_id: int, args: Any, kwargs: Any = None, save_forward_output: bool = True) -> Any:  # noqa: E501, ANN401
        saved = SavedBytes(self._param_ptrs)
        clock = self.recorder.clock
        t0 = clock.mark()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.recorder.intervals.append(("F", self.stage_index, fwd_chunk_id, t0, clock.mark()))
        if self.has_backward:
            self.recorder.hold((self.stage_index, fwd_chunk_id), saved.nbytes)
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True, last_backward: bool = False) -> Any:  # noqa: E501, ANN401
        t0 = self.recorder.clock.mark()
        out = super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
        self.recorder.intervals.append(("B", self.stage_index, bwd_chunk_id, t0, self.recorder.clock.mark()))
        if full_backward:
            self.recorder.release((self.stage_index, bwd_chunk_id))
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> Any:  # noqa: ANN401
        t0 = self.recorder.clock.mark()
        out = super().backward_weight_one_chunk(bwd_chunk_id, last_backward)
        self.recorder.intervals.append(("W", self.stage_index, bwd_chunk_id, t0, self.recorder.clock.mark()))
        self.recorder.release((self.stage_index, bwd_chunk_id))
        return out


@dataclass(frozen=True, kw_only=True)
class StepOut:
    loss: torch.Tensor | None  # mean over the step's micro-batches, on the device (no host sync); last stage only
    intervals: list[tuple[str, int, int, Token, Token]]  # clock tokens (timeline.py)
    act_peak_bytes: int


class Pipeline:
    """This rank's stages of one pipeline and the schedule that drives them."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        plan: Plan,
        *,
        schedule: str,
        microbatches: int,
        virtual: int,
        pp_rank: int,
        pp_size: int,
        group: dist.ProcessGroup | None,
        device: torch.device,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        shard_stage: Callable[[nn.Module, Sequence[int]], nn.Module] | None = None,
    ):
        n = total_stages(schedule, pp_size, virtual)
        if plan.stages != n:
            raise ValueError(f"plan has {plan.stages} stages, schedule {schedule} needs {n}")
        self.schedule_name = schedule
        self.stage_ids = stage_indices(schedule, pp_rank, pp_size, virtual)
        self.num_stages = n
        self.block_ids = [k for s in self.stage_ids for k in plan.blocks_of(s)]
        self.recorder = Recorder(clock=StageClock(device))
        self.modules = [nn.Sequential(*(blocks[k] for k in plan.blocks_of(s))).to(device) for s in self.stage_ids]
        if shard_stage is not None:
            self.modules = [shard_stage(mod, list(plan.blocks_of(s))) for s, mod in zip(self.stage_ids, self.modules, strict=True)]
        self.stages = [
            TimedStage(mod, s, n, device, group=group, recorder=self.recorder)
            for s, mod in zip(self.stage_ids, self.modules, strict=True)
        ]
        self.is_first = any(st.is_first for st in self.stages)
        self.is_last = any(st.is_last for st in self.stages)
        m = microbatches_for(schedule, microbatches)
        cls = SCHEDULE_CLASSES[schedule]
        arg = self.stages if schedule in MULTI_STAGE else self.stages[0]
        # scale_grads: each micro-batch's loss is a mean over its rows, the schedule divides
        # the summed gradients by m, so the result is the gradient of the whole batch's mean.
        self.schedule = cls(arg, m, loss_fn=loss_fn, scale_grads=True)

    def parameters(self) -> list[nn.Parameter]:
        return [p for mod in self.modules for p in mod.parameters()]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> StepOut:
        """Forward and backward of one batch (gradients accumulate into the stage parameters)."""
        self.recorder.reset()
        losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {}
        if self.is_last:
            kwargs = {"target": y, "losses": losses}
        with loss_parallel():  # no-op for plain logits
            if self.is_first:
                self.schedule.step(x, **kwargs)
            else:
                self.schedule.step(**kwargs)
        # loss_parallel's loss is a replicated DTensor: its local value is the loss.
        loss = torch.stack([_local(t).detach().float() for t in losses]).mean() if losses else None
        return StepOut(
            loss=loss, intervals=list(self.recorder.intervals), act_peak_bytes=self.recorder.peak_bytes
        )
