"""Every rank of the data, tensor and hybrid loop stops after the same step when any was asked to.

SIGTERM reaches one pod first (the drained one) or every pod at slightly different times, but
the checkpoint must hold one step of every rank. The loop has no collective of its own between
DDP's gradient buckets to carry a flag, and one more collective per step would cost the
small-model loop measurably (benchmarks/stop_check.py: a check costs 0.1-0.7 ms of a 1-3 ms
digits step on 2 busy cores). So the flag travels in a non-blocking all-reduce (MAX of [stop
requested, seconds per step]) on a gloo group of its own (CPU tensors: no device sync on GPUs,
nothing queued in front of DDP's buckets), started at a check step and read at the next one, by
when it has long completed. Every rank starts and reads it at the same steps and computes the
next check step from the reduced values, so all of them stop after the same step.

Checks are about CHECK_PERIOD_S of training apart, and never more than a quarter of the grace
period: every = clamp(floor(min(CHECK_PERIOD_S, grace / 4) / s), 1, max_every) steps, with s the
slowest rank's mean seconds per step since the previous check. A request is seen by the launch
after it and read one check later, so the loop stops at most 2 x every steps after it: within
2 x CHECK_PERIOD_S (and at most grace / 2) when a step is shorter than that, else within two
steps; the rest of the grace period is left for the checkpoint write. A small model's loop pays
one check per second (a fraction of a millisecond), a slow one a check per step it can afford.
A job whose steps or checkpoint take longer than about half its grace period needs a longer
runPolicy.terminationGracePeriodSeconds.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import stop_request

# Seconds of training between two checks, unless a quarter of the grace period is shorter.
CHECK_PERIOD_S = 1.0
GRACE_SHARE = 0.25
MAX_EVERY = 100_000


class StopAgreement:
    def __init__(self, *, grace_s: float, max_every: int = MAX_EVERY, group: dist.ProcessGroup | None = None) -> None:
        """Collective: every rank constructs it at the same point (a new gloo group)."""
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.period_s = min(CHECK_PERIOD_S, grace_s * GRACE_SHARE)
        self.max_every = max(1, max_every)
        self.next_check = 0
        self._work: dist.Work | None = None
        self._buf = torch.zeros(2, dtype=torch.float64)
        self._since_step, self._since_t = 0, time.perf_counter()

    def start(self, step: int) -> None:
        """The loop starts after `step`; the first check follows the first step."""
        self.next_check = step + 1
        self._since_step, self._since_t = step, time.perf_counter()

    def should_stop(self, step: int) -> bool:
        """Call after every step; True when every rank is to stop after `step` (the same on all)."""
        if step < self.next_check:
            return False
        now = time.perf_counter()
        every = 1
        if self._work is not None:
            self._work.wait()  # started a check interval ago: complete by now, or nearly
            self._work = None
            if self._buf[0] > 0:
                return True
            every = self.every(float(self._buf[1]))
        per_step = (now - self._since_t) / max(1, step - self._since_step)
        self._buf = torch.tensor([1.0 if stop_request.requested() else 0.0, per_step], dtype=torch.float64)
        self._work = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self.next_check = step + every
        self._since_step, self._since_t = step, now
        return False

    def every(self, seconds_per_step: float) -> int:
        """Steps to the next check (a pure function of reduced values: the same on every rank)."""
        if seconds_per_step <= 0:
            return self.max_every
        return max(1, min(self.max_every, int(self.period_s / seconds_per_step)))

    def close(self) -> None:
        """Wait for the check in flight (a normal end: every rank started it, so it completes)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
