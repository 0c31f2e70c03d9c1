"""Fault-tolerant data parallel across replica groups: DDP whose gradient all-reduce is torchft's
(the Manager's all-reduce over the replicas of the current quorum), timed like every mode's.

torchft 0.2.0's own `torchft.DistributedDataParallel` is not used: its comm hook asserts
(`assert fut._fut`, ddp.py:76) when the all-reduce fails synchronously, which gloo does when a
peer dies mid-step ("Connection reset by peer") - the survivors would crash on exactly the failure
they must survive (reproduced with SIGKILL of a replica mid-step; still so on torchft main,
7eb7087: meta-pytorch/torchft#287 made `_ManagedWork.wait` catch the error and return False, but
the future the hook then asserts on is set only after a successful wait). Here the hook waits for the Manager's work (which records a failure in the Manager:
the step is then not committed) and hands DDP the bucket back either way.

The wait inside the hook blocks backward, so the all-reduce is exposed communication (busy =
exposed); the quorum and the commit vote are communication with the other replicas too and are
timed beside it (`FTComm`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .ddp import CommTimes


class FTComm:
    """Seconds and bytes of one step's communication with the other replicas: the all-reduce
    inside backward (`hook`), the quorum before the step and the commit vote after it."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.allreduce_s = 0.0
        self.coordination_s = 0.0  # quorum + should_commit
        self.bytes = 0

    def add_coordination(self, seconds: float) -> None:
        self.coordination_s += seconds

    def take(self) -> CommTimes:
        """This step's communication, then reset. All of it blocked the step: busy = exposed."""
        total = self.allreduce_s + self.coordination_s
        self.allreduce_s = self.coordination_s = 0.0
        return CommTimes(busy_s=total, exposed_s=total)

    def take_bytes(self) -> int:
        b, self.bytes = self.bytes, 0
        return b


def _hook(state: FTComm, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    start = time.perf_counter()
    # The mean over the quorum's replicas, divided before the sum as DDP's own all-reduce does (the
    # same rounding: without a failure the parameters equal plain DDP's). After an error the Manager
    # returns a no-op work and the step is not committed (should_commit is False).
    buf.div_(max(1, state.manager.num_participants()))
    work = state.manager.allreduce(buf, reduce_op=dist.ReduceOp.SUM)
    work.wait()
    state.allreduce_s += time.perf_counter() - start
    state.bytes += buf.numel() * buf.element_size()
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


# DDP checks the hook's annotations, which `from __future__ import annotations` turned into strings.
_hook.__annotations__ = {"state": FTComm, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def wrap_ft_ddp(model: nn.Module, manager: Any, *, device: torch.device, bucket_cap_mb: float) -> tuple[DDP, FTComm]:
    """`model` under DDP whose only collective is the Manager's all-reduce (returned with its clock).

    DDP gets a one-rank dummy group (it has no other to speak to: the replicas change with every
    quorum) and never rebuilds its buckets (find_unused_parameters): a replica that joins later
    must lay its buckets out exactly as the others did, which a rebuild after the first step would not."""
    from torchft.process_group import ProcessGroupDummy  # noqa: PLC0415 - torchft (only fault-tolerant runs)

    model = model.to(device)
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        process_group=ProcessGroupDummy(0, 1),
        find_unused_parameters=True,
        bucket_cap_mb=bucket_cap_mb,
    )
    comm = FTComm(manager)
    ddp.register_comm_hook(comm, _hook)
    return ddp, comm
