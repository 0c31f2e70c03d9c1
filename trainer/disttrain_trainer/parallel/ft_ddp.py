"""Fault-tolerant data parallel across replica groups: the gradients are all-reduced over the
replicas of the current quorum (torchft's Manager) at the end of every backward, bucketed exactly
as plain DistributedDataParallel buckets them, and timed like every mode's communication.

Why not DDP with a comm hook. torchft 0.2.0's own `torchft.DistributedDataParallel` asserts in its
hook (`assert fut._fut`, ddp.py:76) when the all-reduce fails synchronously, which gloo does when a
peer dies mid-step ("Connection reset by peer"): the survivors would crash on exactly the failure
they must survive (reproduced with SIGKILL of a replica mid-step; still so on torchft main,
7eb7087: meta-pytorch/torchft#287 made `_ManagedWork.wait` catch the error and return False, but the
future the hook then asserts on is set only after a successful wait). And DDP with a hook of ours
lays its buckets out by a rule no joining replica can follow: DDP rebuilds them after its first
iteration, so a replica that joins later would sum its first step's gradients against peers laid
out differently (element i of one replica's buffer added to element j of another's); keeping DDP's
first layout for ever (find_unused_parameters) avoids that but sums every element in another order
than plain DDP does, which gloo's ring turns into rounding differences that training amplifies.

Here the layout is the run's state (`BucketLayout`): DDP's first-iteration layout (every parameter
in one bucket, in module order) until the first committed step, then DDP's rebuilt one (the order
the gradients became ready in that step, cut at bucketCapMB). It travels with the healed state and
the checkpoint, so every replica of a quorum lays out the same step the same way; without a failure
the parameters are bitwise those of plain DDP. The order is deterministic for the same code, but a
model whose backward order varies would give replicas different layouts: the first one is agreed
over the quorum (an all-reduce of its fingerprint), and where the replicas disagree they keep the
module-order layout for the rest of the run.

The all-reduce blocks the end of backward, so it is exposed communication (busy = exposed); the
quorum and the commit vote are communication with the other replicas too and are timed beside it
(`FTComm`). It is queued on the autograd engine by the first gradient of a backward: a nested
backward (a model's own reentrant activation checkpointing, which plain DDP refuses without
static_graph) gets one of its own, so its gradients are all-reduced at its end and again with the
rest, the same mean (every replica holds it after the first) at twice the traffic. The trainer's
own activation checkpointing is not reentrant.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .comm_profile import ProfiledComm
from .ddp import CommTimes

MIB = 1024 * 1024  # DDP's bucket_cap_mb unit


class FTComm:
    """Seconds and bytes of one step's communication: the gradient all-reduce over the replicas, the
    quorum before the step and the commit vote after it; for an HSDP group (`profiled`), also the
    FSDP collectives among its own processes, which have no hook to time them: its steps run under
    the profiler as plain FSDP's do (comm_profile.py, one step in SAMPLE_EVERY), whose collectives
    include the all-reduce over the replicas (gloo records it like any other)."""

    def __init__(self, manager: Any, *, group: Any | None = None, profiled: ProfiledComm | None = None) -> None:
        self.manager = manager
        self.group = group
        self.profiled = profiled
        self.allreduce_s = 0.0
        self.coordination_s = 0.0  # quorum + should_commit
        self.bytes = 0

    def sum_over_quorum(self, tensors: list[torch.Tensor]) -> None:
        """Each of `tensors` summed in place over the quorum's replicas. After a failure (a peer died
        or went silent past the group's timeout) the Manager holds the error, the step is not
        committed and the tensors hold garbage.

        With `group` (the replica's gloo process group, which the Manager reconfigures at each new
        quorum) the sums go to it directly. torchft's Manager.allreduce would chain futures onto each
        and register a timeout on its event-loop thread: about 0.5 ms of CPU per step and replica on
        the development VM, more than the digits MLP's forward and backward, and redundant, as the
        group's collectives time out after heartbeatTimeoutSeconds themselves. Without it (NCCL) the
        Manager's work also keeps the CUDA streams in order, so the sums go through the Manager."""
        m = self.manager
        if self.group is None:
            works = [m.allreduce(t, reduce_op=dist.ReduceOp.SUM) for t in tensors]
            for work in works:
                work.wait()
            return
        if m.errored() is not None:  # as Manager.allreduce: nothing more this step
            return
        m.wait_quorum()
        if not m.is_participating():  # (a replica still healing adds nothing)
            for t in tensors:
                t.zero_()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        try:
            works = [self.group.allreduce([t], opts) for t in tensors]
            for work in works:
                work.wait()
        except Exception as e:  # noqa: BLE001 - any failure of the collective votes the step down
            m.report_error(e)

    def add_coordination(self, seconds: float) -> None:
        self.coordination_s += seconds

    def step(self) -> contextlib.AbstractContextManager[None]:
        """Around the step's forward, backward and optimizer step."""
        return self.profiled.step() if self.profiled is not None else contextlib.nullcontext()

    def take(self) -> CommTimes:
        """This step's communication, then reset. The all-reduce and the coordination blocked the
        step (busy = exposed); the group's collectives are what the profiler measured."""
        coordination, allreduce = self.coordination_s, self.allreduce_s
        self.allreduce_s = self.coordination_s = 0.0
        if self.profiled is not None:
            group = self.profiled.take()
            return CommTimes(busy_s=group.busy_s + coordination, exposed_s=group.exposed_s + coordination)
        return CommTimes(busy_s=allreduce + coordination, exposed_s=allreduce + coordination)

    def take_bytes(self) -> int:
        b, self.bytes = self.bytes, 0
        return b


Buckets = list[list[int]]  # indices into the trainable parameters, bucket by bucket, in buffer order


def first_iteration_buckets(params: list[torch.Tensor]) -> Buckets:
    """DDP's layout before its first rebuild (find_unused_parameters=False): one bucket per dtype
    and device, each parameter in module order (DDP's own assignment call, then its reversal)."""
    indices, _ = dist._compute_bucket_assignment_by_size(params, [sys.maxsize], [False] * len(params))
    return [list(b) for b in reversed(indices)]


def rebuilt_buckets(params: list[torch.Tensor], ready: list[int], cap_bytes: int) -> Buckets:
    """DDP's layout after its first iteration: the parameters in the order their gradients became
    ready, cut into buckets of cap_bytes (with bucketCapMB given, DDP's first bucket has the same
    cap). Parameters whose gradient never came follow, last first."""
    seen = set(ready)
    order = list(ready) + [i for i in reversed(range(len(params))) if i not in seen]
    indices, _ = dist._compute_bucket_assignment_by_size([params[i] for i in order], [cap_bytes, cap_bytes],
                                                         [False] * len(order), order)  # fmt: skip
    return [list(b) for b in indices]


def _fingerprint(buckets: Buckets) -> int:
    """48 bits of the layout's sha256: exact in a float64, so its spread over the quorum tells
    whether every replica holds the same layout."""
    return int(hashlib.sha256(repr(buckets).encode()).hexdigest()[:12], 16)


def spread_over_quorum(manager: Any, t: torch.Tensor) -> torch.Tensor:
    """max - min of each element of `t` over the quorum's replicas (one all-reduce MAX of t and -t):
    0 where they all hold the same value. Meaningless unless the step then commits."""
    flat = t.reshape(-1)
    both = torch.cat([flat, -flat])
    manager.allreduce(both, reduce_op=dist.ReduceOp.MAX).wait()
    return both[: flat.numel()] + both[flat.numel() :]


class BucketLayout:
    """The run's gradient layout: None until the first committed step (DDP's first-iteration
    layout), then the agreed rebuilt one. Part of the healed state and the checkpoint."""

    def __init__(self) -> None:
        self.buckets: Buckets | None = None
        self.pending: Buckets | None = None  # decided in this step's backward, kept if it commits

    def state_dict(self) -> Buckets | None:
        return self.buckets

    def load_state_dict(self, buckets: Buckets | None) -> None:
        self.buckets = [list(map(int, b)) for b in buckets] if buckets is not None else None
        self.pending = None

    def settle(self, committed: bool) -> None:
        """After the commit vote: a layout decided in a committed step becomes the run's (the vote
        is unanimous, so every replica of the quorum takes it at the same step)."""
        if committed and self.pending is not None:
            self.buckets = self.pending
        self.pending = None


class _Backward:
    """One backward's bookkeeping, in a plain object: every attribute written on an nn.Module goes
    through Module.__setattr__'s checks, a few microseconds each, several times a step."""

    __slots__ = ("placed", "queued", "ready", "scale")

    def __init__(self) -> None:
        self.queued = False
        self.ready: list[int] = []  # this backward's order, while the layout is still the first one
        self.placed: list[bool] = []  # which gradients this backward has written into their bucket
        self.scale = 1.0


class FTDataParallel(nn.Module):
    """`module` whose gradients are averaged over the quorum's replicas at the end of each backward
    outside `no_sync` (`comm` holds the time and bytes).

    Each bucket is one flat tensor, and after a synchronising backward every gradient is a view of
    its bucket (DDP's gradient_as_bucket_view): as a gradient is accumulated, its hook writes it
    scaled by 1 / quorum size into its place in the bucket (one pass, where concatenating after
    backward, scaling and copying back takes three), and the all-reduce leaves the mean in place."""

    def __init__(self, module: nn.Module, manager: Any, *, layout: BucketLayout, bucket_cap_mb: float,
                 group: Any | None = None) -> None:  # fmt: skip
        super().__init__()
        self.module = module
        self.manager = manager
        self.layout = layout
        self.comm = FTComm(manager, group=group)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._first = first_iteration_buckets(self._params)
        self._cap = int(bucket_cap_mb * MIB)
        self._sync = True
        self._pass = _Backward()
        self._built_for: Buckets | None = None  # the layout the flat buckets below are cut for
        self._flats: list[torch.Tensor] = []
        self._flat_bytes = 0
        self._views: list[torch.Tensor] = []  # parameter i's place in its bucket
        for i, p in enumerate(self._params):
            p.register_post_accumulate_grad_hook(functools.partial(self._on_ready, i))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient-accumulation micro-steps: gradients accumulate locally, nothing is all-reduced."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    def _cut_buckets(self) -> None:
        """The flat buckets of this step's layout, cut again when the layout changed."""
        buckets = self.layout.buckets or self._first
        if buckets is not self._built_for:
            self._flats, views = [], [torch.empty(0)] * len(self._params)
            for bucket in buckets:
                first = self._params[bucket[0]]
                flat = torch.empty(sum(self._params[i].numel() for i in bucket), dtype=first.dtype, device=first.device)
                offset = 0
                for i in bucket:
                    p = self._params[i]
                    views[i] = flat[offset : offset + p.numel()].view_as(p)
                    offset += p.numel()
                self._flats.append(flat)
            self._views, self._built_for = views, buckets
            self._flat_bytes = sum(flat.numel() * flat.element_size() for flat in self._flats)

    def _on_ready(self, index: int, param: torch.Tensor) -> None:
        if not self._sync:
            return
        bw = self._pass
        if not bw.queued:  # the first gradient of this backward: the all-reduce runs when it is all done
            bw.queued = True
            self._cut_buckets()
            bw.scale = 1.0 / max(1, self.manager.num_participants())
            bw.placed = [False] * len(self._params)
            torch.autograd.Variable._execution_engine.queue_callback(self._all_reduce)
        if self.layout.buckets is None:
            bw.ready.append(index)
        self._place(index, param)

    def _place(self, index: int, param: torch.Tensor) -> None:
        """Parameter `index`'s gradient times 1 / quorum size into its place in its bucket, which
        becomes the gradient: scaled before the sum, and by the reciprocal, as DDP's reducer does
        (x * (1/3) and x / 3 round differently)."""
        view, grad, scale = self._views[index], param.grad, self._pass.scale
        if grad is view:  # accumulated in place (zero_grad without set_to_none, or no_sync micro-steps)
            view.mul_(scale)
        elif grad is None:  # no gradient this step: zeros, as DDP sends for an unused parameter
            view.zero_()
            param.grad = view
        else:
            torch.mul(grad, scale, out=view)
            param.grad = view
        self._pass.placed[index] = True

    def _all_reduce(self) -> None:
        bw = self._pass
        bw.queued = False
        for i, placed in enumerate(bw.placed):
            if not placed:  # unused in this backward (its hook never ran)
                self._place(i, self._params[i])
        start = time.perf_counter()
        self.comm.sum_over_quorum(self._flats)
        self.comm.bytes += self._flat_bytes
        if self.layout.buckets is None:
            self.layout.pending = self._agree(rebuilt_buckets(self._params, bw.ready, self._cap))
        bw.ready = []
        self.comm.allreduce_s += time.perf_counter() - start

    def _agree(self, buckets: Buckets) -> Buckets:
        """`buckets` if every replica of the quorum derived the same, else the first layout (each
        replica sees the same MAX, so all of them decide alike)."""
        f = torch.tensor([float(_fingerprint(buckets))], dtype=torch.float64, device=self._params[0].device)
        if float(spread_over_quorum(self.manager, f)[0]) == 0.0:
            return buckets
        print("disttrain-trainer: the replicas' gradients became ready in different orders; they keep the "
              "module-order bucket layout", flush=True)  # fmt: skip
        return [list(b) for b in self._first]
