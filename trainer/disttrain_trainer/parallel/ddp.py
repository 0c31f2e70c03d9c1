"""Synchronous data parallel: DistributedDataParallel, with communication timed by DDP itself.

Gradients are all-reduced by DDP's built-in C++ paths wherever one exists (plain
all-reduce; fp16 compression through `_register_builtin_comm_hook`); only
PowerSGD needs torch's Python hook. Communication is timed by DDP's own reducer
(`CommClock`), which stamps, for the synchronising backward of every step, when
the first bucket's collective was launched, when the autograd engine finished
(the last gradient produced), and when the last collective completed. That costs
no Python on the gradient path; the step loop reads the stamps of a sample of steps
(modes/data/loop.py: reading them costs 10-25 us, a few percent of a small model's CPU step).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from disttrain_api.model import TrainingSpec
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

from ..process.dist_env import DistContext
from ..process.precision import Amp

NS = 1e-9


@dataclass(frozen=True, kw_only=True)
class CommTimes:
    """One step's gradient communication, in seconds.

    busy: from the launch of the first bucket's collective to the completion of the last
        (a collective in flight, overlapped with backward or not);
    exposed: from the end of backward compute (the last gradient produced) to that
        completion: the time the step waited on communication that nothing overlapped.
    """

    busy_s: float
    exposed_s: float


NEVER_SAMPLE = 2**31 - 1  # a DDP runtime-logging sample rate no run reaches


class CommClock:
    """Reads DDP's reducer timer: DDP's own C++ timestamps (CUDA events on a GPU), on every
    iteration the loop measures (see `measure_next`).

    DDP fills its logging data at the start of the *next* forward; `take` asks for it
    right after the step instead (`set_runtime_stats_and_log`), so a step's figures
    belong to that step. Gradient-accumulation micro-steps under `no_sync` are not
    timed by DDP, and need not be: they do not communicate.
    """

    def __init__(self, ddp: DDP) -> None:
        ddp._set_ddp_runtime_logging_sample_rate(1)
        self._ddp, self._measuring = ddp, True
        self._logger = ddp.logger

    def measure_next(self, on: bool) -> None:
        """Whether DDP times the next iteration. Reading a CUDA timer waits for that iteration's
        events, so a GPU loop that runs ahead turns it off for the steps it does not measure,
        and a CPU loop for the steps it does not read (DDP still times its first 10 iterations)."""
        if on != self._measuring:
            self._ddp._set_ddp_runtime_logging_sample_rate(1 if on else NEVER_SAMPLE)
            self._measuring = on

    def take(self) -> CommTimes:
        logger = self._logger
        assert logger is not None
        logger.set_runtime_stats_and_log()
        ints = logger._get_ddp_logging_data().ints_map
        busy = ints.get("backward_comm_time", 0) * NS
        # DDP leaves the overlap at 0 when the last gradient came before the first launch
        # (nothing overlapped): exposed is then all of busy.
        overlap = ints.get("backward_compute_comm_overlap_time", 0) * NS
        return CommTimes(busy_s=busy, exposed_s=max(0.0, busy - overlap))


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of gradients one step synchronises (before any compression)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _in_issue_order(hook: Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
                    ) -> Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]:  # fmt: skip
    """PowerSGD on gloo with several buckets. Gloo pairs the collectives of two ranks by the
    order they are issued. PowerSGD issues a bucket's second and third all-reduce (P, then Q)
    from callbacks of the first, on gloo's threads, racing the next bucket's first all-reduce
    from the autograd thread: ranks issue them in different orders and gloo fails with
    "Received data size doesn't match". Finishing each bucket inside its hook keeps the
    order the same on every rank (it gives up the overlap of that bucket with backward)."""

    @functools.wraps(hook)  # DDP checks the hook's signature (its annotations must be real types)
    def ordered(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut = hook(state, bucket)
        fut.wait()
        return fut

    return ordered


def _register_compression(ddp: DDP, training: TrainingSpec) -> None:
    if training.gradient_compression == "fp16":
        # C++ hook: casts each bucket to fp16 for the all-reduce and back (half the bytes).
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif training.gradient_compression == "powersgd":
        # start_powerSGD_iter must be >= 2 with error feedback; compress from the second step on.
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=training.powersgd_rank,
            start_powerSGD_iter=2,
            min_compression_rate=1.0,
        )
        hook = psgd.powerSGD_hook if ddp.device_ids else _in_issue_order(psgd.powerSGD_hook)
        ddp.register_comm_hook(state, hook)
        ddp.comm_hook_state = state  # checkpoints carry it: PowerSGD's error feedback is per-rank state
    # "none": DDP's built-in C++ all-reduce, no hook at all.


def wrap_ddp(model: nn.Module, *, ctx: DistContext, training: TrainingSpec) -> DDP:
    model = model.to(ctx.device)
    ddp = DDP(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=training.bucket_cap_mb,
    )
    _register_compression(ddp, training)
    return ddp


@dataclass(frozen=True, kw_only=True)
class StepResult:
    loss: torch.Tensor  # mean loss of this rank's samples, still on the device (no host sync)
    samples: int  # this rank's samples


def train_step(
    model: nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    amp: Amp,
) -> StepResult:
    """One optimizer step over `len(micro_batches)` micro-steps; only the last one all-reduces (no_sync).

    Nothing here waits for the device or copies to the host: the loss stays a tensor
    that the loop reads once per log interval."""
    optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    fp32 = amp.precision == "fp32"
    total: torch.Tensor | None = None
    samples = 0
    for i, (x, y) in enumerate(micro_batches):
        # DDP and the fault-tolerant FTDataParallel defer their all-reduce with no_sync; FSDP2 and a
        # plain module have none.
        sync = i == n - 1 or not hasattr(model, "no_sync")
        with contextlib.nullcontext() if sync else model.no_sync():  # type: ignore[operator]
            if fp32:
                loss = loss_fn(model(x), y)
            else:
                with amp.autocast():
                    loss = loss_fn(model(x), y)
            # The mean over the whole (local) batch, as one large batch would give.
            scaled = loss / n if n > 1 else loss
            if amp.scaler is not None:
                amp.scaler.scale(scaled).backward()
            else:
                scaled.backward()
        total = loss.detach() if total is None else total + loss.detach()
        samples += int(x.shape[0])
    if amp.scaler is not None:
        amp.scaler.step(optimizer)
        amp.scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    assert total is not None
    return StepResult(loss=total / n if n > 1 else total, samples=samples)
