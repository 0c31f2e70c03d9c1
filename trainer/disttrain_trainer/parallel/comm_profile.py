"""Communication of tensor-parallel and FSDP steps, measured with the PyTorch profiler.

DDP exposes a hook per gradient bucket (parallel/ddp.py times those); the
collectives that DTensor and FSDP2 issue have no such hook, so every step of a
mesh mode runs under `torch.profiler` and is read back from its events:

  busy    = the union of the intervals in which the backend ran a collective:
            gloo records `gloo:<collective>` on its worker threads from start to
            completion; on CUDA the NCCL kernels (`nccl...`) on the device;
  exposed = the part of busy that no computation overlaps:
            CPU/gloo: no operator (`aten::*`) ran on the training thread, which
            was waiting (`wait_tensor`, FSDP's waits, DDP's reducer finalising),
            issuing, or between operators. The last part makes it an upper bound:
            Python overhead between operators while a collective runs counts as
            exposed;
            CUDA: NCCL kernel time not overlapped by any other kernel;
  bytes   = each collective's input payload on this rank (shape x dtype size as
            the profiler recorded them): what Megatron's formula counts. A ring
            all-reduce puts about 2(p-1)/p of that on the wire.

Only the step is profiled (`step()` wraps it), so checkpoint and evaluation
collectives never count as step communication. Sampled: the first step and
every SAMPLE_EVERY-th after it are profiled; the steps between report the
latest measurement (a step's collectives are the same every step; its times
are those of the sampled step). The profiler costs time per operator;
benchmarks/modes.py reports it (profiled vs unprofiled step time).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .ddp import CommTimes

STEP_ANNOTATION = "disttrain:step"
# One step in SAMPLE_EVERY is profiled: the profiler costs time per operator.
SAMPLE_EVERY = 10
COLLECTIVE_PREFIXES = ("gloo:", "nccl")
COMPUTE_PREFIX = "aten::"
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
}  # fmt: skip

Span = tuple[float, float]


@dataclass(frozen=True, kw_only=True)
class CommSample:
    busy_s: float = 0.0
    exposed_s: float = 0.0
    bytes: int = 0
    # collective name -> (count, bytes), e.g. {"all_reduce": (10, 655360)}
    by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)


def merge(spans: Iterable[Span]) -> list[Span]:
    """Sorted, non-overlapping union of intervals."""
    out: list[Span] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def intersect(a: list[Span], b: list[Span]) -> list[Span]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def total(spans: list[Span]) -> float:
    return sum(e - s for s, e in spans)


def _payload(ev: Any) -> int:
    shapes, dtypes = ev.shapes(), ev.dtypes()
    if not shapes or not dtypes:
        return 0
    return math.prod(shapes[0]) * DTYPE_BYTES.get(dtypes[0], 4)


def analyse(events: Iterable[Any]) -> CommSample:
    """A CommSample from kineto events of one profiled step."""
    events = list(events)
    step = [e for e in events if e.name() == STEP_ANNOTATION]
    main_thread = step[0].start_thread_id() if step else None
    busy, compute, kernels = [], [], []
    by_kind: dict[str, tuple[int, int]] = {}
    for ev in events:
        name = ev.name()
        span = (ev.start_ns() / 1e9, ev.end_ns() / 1e9)
        on_device = ev.device_type() == torch.autograd.DeviceType.CUDA
        if name.lower().startswith(COLLECTIVE_PREFIXES) and (on_device or name.startswith("gloo:")):
            busy.append(span)
            kind = name.split(":", 1)[1] if ":" in name else name
            count, nbytes = by_kind.get(kind, (0, 0))
            by_kind[kind] = (count + 1, nbytes + _payload(ev))
        elif on_device:
            kernels.append(span)
        elif ev.start_thread_id() == main_thread and name.startswith(COMPUTE_PREFIX):
            compute.append(span)
    busy_m = merge(busy)
    on_gpu = any(ev.device_type() == torch.autograd.DeviceType.CUDA for ev in events)
    exposed = total(busy_m) - total(intersect(busy_m, merge(kernels if on_gpu else compute)))
    return CommSample(busy_s=total(busy_m), exposed_s=exposed,
                      bytes=sum(b for _, b in by_kind.values()), by_kind=by_kind)  # fmt: skip


def census(events: Iterable[Any]) -> dict[str, tuple[int, int]]:
    """Collective kind -> (calls, input payload bytes on this rank) of one profiled step, from the
    host-side events the process group records for every collective it runs (`gloo:all_reduce`,
    `nccl:all_reduce`, ... with the input's shape): the same names on CPU and GPU."""
    out: dict[str, tuple[int, int]] = {}
    for ev in events:
        name = ev.name()
        if not name.startswith(("gloo:", "nccl:")) or ev.device_type() == torch.autograd.DeviceType.CUDA:
            continue
        kind = name.split(":", 1)[1]
        count, nbytes = out.get(kind, (0, 0))
        out[kind] = (count + 1, nbytes + _payload(ev))
    return out


class ProfiledComm:
    """The communication clock of mesh modes: the same `take()` as data parallel's CommClock."""

    def __init__(self, every: int = SAMPLE_EVERY) -> None:
        # Kineto logs two lines per profiled step at a level above ERROR ("USDT");
        # 6 silences them. Read at the first profiler start, so setting it here works.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self.every = every
        self.steps = 0
        self.last = CommSample()  # the latest measurement
        self.taken = CommSample()  # the sample the last take() returned
        self.kinds: dict[str, tuple[int, int]] = {}  # census() of the latest profiled step

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        sampled = self.steps % self.every == 0
        self.steps += 1
        if not sampled:
            yield
            return
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities, record_shapes=True) as prof:
            with record_function(STEP_ANNOTATION):
                yield
        events = prof.profiler.kineto_results.events()
        self.last = analyse(events)
        self.kinds = census(events)  # the scaling forecast's inputs (scaling_record.py)
        # A `profile` sits in a reference cycle (its action map holds its own bound methods),
        # so only the cyclic GC frees it, rarely, since its events live in C++ memory that
        # Python does not count. Dropping the recording here frees the events at once
        # (measured: a TP GPT step's trace is tens of MB; RSS grew ~6 MB per step without this).
        prof.profiler = None

    def take(self) -> CommTimes:
        """Busy and exposed seconds of the latest profiled step; `taken` keeps its bytes and kinds."""
        self.taken = self.last
        return CommTimes(busy_s=self.last.busy_s, exposed_s=self.last.exposed_s)
