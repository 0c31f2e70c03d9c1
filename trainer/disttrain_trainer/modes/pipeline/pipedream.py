"""PipeDream: asynchronous 1F1B with weight stashing (Narayanan et al. 2019), on P2P send/recv.

PyTorch ships only flushing schedules, so this one is written here. Stage s of
p runs p - s - 1 forwards to fill the pipeline, then alternates one forward and
one backward, and updates its weights after *every* backward: there is no
flush between micro-batches, so while micro-batch i is in flight its stage may
already have applied the updates of micro-batches i-1, i-2, ...

Weight stashing keeps that correct: each forward runs on a snapshot of the
stage's weights taken at that moment (the version) and its autograd graph
refers to the snapshot, so the backward of micro-batch i computes its gradient
with exactly the weights its forward used, even though the live weights have
moved on; the gradient is then applied to the live weights. A stage holds at
most p - s versions at once (one per micro-batch in flight). As in the paper,
stages do not synchronise versions with each other (no vertical sync).

A trainer step feeds `microbatches` micro-batches through this schedule and
ends when the last backward is done, so checkpoints and metrics see a settled
state; within the step nothing waits for a flush.

Wire format per message: a fixed-size int64 header (rank, shape) and then the
float tensor; activations go down the pipeline with TAG_ACT, gradients up with
TAG_GRAD.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from .schedules import Recorder, SavedBytes, StepOut
from .timeline import StageClock

TAG_ACT, TAG_GRAD = 10, 11
MAX_DIMS = 8


@dataclass
class Flight:
    """A micro-batch between its forward and its backward on this stage."""

    version: int
    weights: dict[str, torch.Tensor]  # the stash: the snapshot the forward ran on
    inp: torch.Tensor
    out: torch.Tensor


@dataclass
class TraceEntry:
    """What a test needs to check the stashing invariant for one micro-batch."""

    mb: int
    forward_version: int
    backward_version: int  # the live version when the backward ran
    stash: dict[str, torch.Tensor]
    live: dict[str, torch.Tensor]  # the stage's weights when the backward ran
    inp: torch.Tensor
    grad_out: torch.Tensor | None
    grads: dict[str, torch.Tensor]


@dataclass
class PipeDreamStage:
    module: nn.Module
    stage: int
    stages: int
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    device: torch.device
    group: dist.ProcessGroup | None = None
    trace: list[TraceEntry] | None = None  # set to [] to record (tests)
    version: int = 0
    recorder: Recorder = field(default_factory=Recorder)
    _sends: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.recorder.clock = StageClock(self.device)  # CUDA events on a GPU (timeline.py)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def _peer(self, stage: int) -> int:
        return dist.get_global_rank(self.group, stage) if self.group is not None else stage

    def _send(self, t: torch.Tensor, stage: int, tag: int) -> None:
        header = torch.zeros(MAX_DIMS + 1, dtype=torch.int64, device=self.device)  # NCCL: on the GPU
        header[0] = t.dim()
        header[1 : 1 + t.dim()] = torch.tensor(t.shape, device=self.device)
        peer = self._peer(stage)
        self._sends.append(dist.isend(header, peer, group=self.group, tag=tag))
        self._sends.append(dist.isend(t.detach().contiguous(), peer, group=self.group, tag=tag))

    def _recv(self, stage: int, tag: int) -> torch.Tensor:
        header = torch.zeros(MAX_DIMS + 1, dtype=torch.int64, device=self.device)  # NCCL: on the GPU
        peer = self._peer(stage)
        dist.recv(header, peer, group=self.group, tag=tag)
        shape = [int(d) for d in header[1 : 1 + int(header[0])]]
        t = torch.empty(shape, dtype=torch.float32, device=self.device)
        dist.recv(t, peer, group=self.group, tag=tag)
        return t

    def _forward(self, mb: int, x: torch.Tensor | None, flights: dict[int, Flight]) -> None:
        inp = x if self.is_first else self._recv(self.stage - 1, TAG_ACT).requires_grad_()
        assert inp is not None
        t0 = self.recorder.clock.mark()
        stash = {n: p.detach().clone().requires_grad_() for n, p in self.module.named_parameters()}
        saved = SavedBytes({w.untyped_storage().data_ptr() for w in stash.values()})
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            out = functional_call(self.module, stash, (inp,))
        flights[mb] = Flight(version=self.version, weights=stash, inp=inp, out=out)
        self.recorder.hold((self.stage, mb), saved.nbytes)
        self.recorder.intervals.append(("F", self.stage, mb, t0, self.recorder.clock.mark()))
        if not self.is_last:
            self._send(out, self.stage + 1, TAG_ACT)

    def _backward(self, mb: int, y: torch.Tensor | None, flights: dict[int, Flight], losses: list[torch.Tensor]) -> None:
        grad_out = None if self.is_last else self._recv(self.stage + 1, TAG_GRAD)
        t0 = self.recorder.clock.mark()
        f = flights.pop(mb)
        if self.is_last:
            assert y is not None
            loss = self.loss_fn(f.out, y)
            losses.append(loss.detach().float())
            torch.autograd.backward(loss)
        else:
            torch.autograd.backward(f.out, grad_out)
        if not self.is_first:
            assert f.inp.grad is not None
            self._send(f.inp.grad, self.stage - 1, TAG_GRAD)
        if self.trace is not None:
            self.trace.append(TraceEntry(
                mb=mb, forward_version=f.version, backward_version=self.version,
                stash={n: w.detach().clone() for n, w in f.weights.items()},
                live={n: p.detach().clone() for n, p in self.module.named_parameters()}, inp=f.inp.detach().clone(),
                grad_out=grad_out, grads={n: w.grad.clone() for n, w in f.weights.items() if w.grad is not None},
            ))  # fmt: skip
        # The stashed version's gradient updates the live weights.
        for n, p in self.module.named_parameters():
            p.grad = f.weights[n].grad
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.recorder.release((self.stage, mb))
        self.recorder.intervals.append(("B", self.stage, mb, t0, self.recorder.clock.mark()))

    def step(self, x_mbs: Sequence[torch.Tensor] | None, y_mbs: Sequence[torch.Tensor] | None, m: int) -> StepOut:
        """One trainer step: m micro-batches through the asynchronous 1F1B schedule."""
        self.recorder.reset()
        flights: dict[int, Flight] = {}
        losses: list[torch.Tensor] = []

        def xs(i: int) -> torch.Tensor | None:
            return x_mbs[i] if x_mbs is not None else None

        def ys(i: int) -> torch.Tensor | None:
            return y_mbs[i] if y_mbs is not None else None

        warmup = min(self.stages - self.stage - 1, m)
        for i in range(warmup):
            self._forward(i, xs(i), flights)
        for i in range(m - warmup):
            self._forward(warmup + i, xs(warmup + i), flights)
            self._backward(i, ys(i), flights, losses)
        for i in range(m - warmup, m):
            self._backward(i, ys(i), flights, losses)
        for w in self._sends:
            w.wait()
        self._sends.clear()
        return StepOut(
            loss=torch.stack(losses).mean() if losses else None,
            intervals=list(self.recorder.intervals),
            act_peak_bytes=self.recorder.peak_bytes,
        )
