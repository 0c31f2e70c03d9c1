"""Where a pipeline stage's step time went, from the measured compute intervals of all stages.

Every rank records when each of its forward (F), backward (B) and weight-gradient
(W, zero-bubble schedules) computations of a micro-batch started and ended, on
the host's wall clock (`time.time()`, shared by processes on one machine and
NTP-synchronised across machines). After the step the ranks of a pipeline
exchange these timelines, and each rank splits its idle time:

  - bubble: waiting for a peer stage that is still computing the input this
    rank needs next (the activation of micro-batch i, or its gradient), and,
    after this rank's last computation, waiting for the rest of the pipeline
    to finish the step — idle time caused by the schedule, not by the network;
  - p2p: the remaining idle time before a computation — the input was ready
    on the peer but still in flight (send/recv), or this rank was waiting on
    its own sends.

compute + p2p + bubble = the pipeline's step window (first start to last end
over all stages), per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# (kind, stage index, micro-batch, start, end)
Interval = tuple[str, int, int, float, float]


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    window_s: float
    compute_s: float
    p2p_s: float
    bubble_s: float

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.window_s if self.window_s > 0 else 0.0


def _producer(kind: str, stage: int, mb: int, stages: int) -> tuple[str, int, int] | None:
    """The computation whose output this one consumes, or None for the first stage's forward."""
    if kind == "F":
        return ("F", stage - 1, mb) if stage > 0 else None
    if kind == "B":
        return ("B", stage + 1, mb) if stage < stages - 1 else ("F", stage, mb)
    return ("B", stage, mb)  # W follows its own B


def split_idle(own: Sequence[Interval], all_ranks: Sequence[Sequence[Interval]], stages: int) -> StageTimes:
    """Split this rank's step window into compute, p2p and bubble (see the module docstring)."""
    everything = [iv for r in all_ranks for iv in r]
    if not everything:
        return StageTimes(window_s=0.0, compute_s=0.0, p2p_s=0.0, bubble_s=0.0)
    start = min(iv[3] for iv in everything)
    end = max(iv[4] for iv in everything)
    done = {(k, s, m): e for k, s, m, _, e in everything}
    mine = {(k, s, m) for k, s, m, _, _ in own}
    compute = p2p = bubble = 0.0
    free_from = start
    for kind, stage, mb, t0, t1 in sorted(own, key=lambda iv: iv[3]):
        compute += t1 - t0
        gap_end = max(t0, free_from)
        dep = _producer(kind, stage, mb, stages)
        if dep is not None and dep not in mine and dep in done:
            ready = done[dep]
            bubble += max(0.0, min(ready, gap_end) - free_from)
            p2p += max(0.0, gap_end - max(ready, free_from))
        else:
            p2p += gap_end - free_from
        free_from = max(free_from, t1)
    bubble += max(0.0, end - free_from)
    return StageTimes(window_s=end - start, compute_s=compute, p2p_s=p2p, bubble_s=bubble)


def theory_bubble(stages: int, microbatches: int) -> float:
    """GPipe's bubble fraction for equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)
