"""A synchronous pipeline's step time from its stages' per-micro-batch times.

Stage i needs s_i seconds per micro-batch (forward + backward), and the boundary after it
carries each micro-batch's activation forward and its gradient back (x_i seconds). With m
micro-batches through p stages (GPipe, or 1F1B, which reorders the same work):

  T = sum_i (s_i + x_i) + (m - 1) x max_i (s_i + x_i)

Derivation: the first micro-batch crosses every stage and boundary once (the pipeline
filling and, for its backward, draining: the sum); each of the other m - 1 follows it at
the pace of the slowest stage, which never idles once the pipeline is full (the max).
For p equal stages of s this is (m + p - 1) x s, so the idle share of a stage is
(p - 1) / (m + p - 1): GPipe's bubble (Huang et al. 2019). Unequal stages leave the
faster ones idle beyond that, which is why the partition minimises the slowest stage.

Only arithmetic; the operator and the CLI use it without torch.
"""

from __future__ import annotations

from collections.abc import Sequence


def makespan(stage_s: Sequence[float], *, microbatches: int) -> float:
    """T above; `stage_s` already includes each stage's boundary transfer."""
    if not stage_s:
        return 0.0
    return sum(stage_s) + (max(1, microbatches) - 1) * max(stage_s)


def bubble_fraction(stages: int, microbatches: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of each of p equal stages."""
    return (stages - 1) / (microbatches + stages - 1)


def min_max_split(costs: Sequence[float], stages: int, *, cut_cost: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """Contiguous [a, b) block ranges, one per stage, minimising the slowest stage.

    A stage's cost is its blocks' costs plus `cut_cost[b - 1]` when it sends its last block's
    output on (the last stage sends nothing). Dynamic programming over (stages, blocks), the
    partitioner PipeDream describes and the trainer's `partition.min_max_bounds` runs."""
    n = len(costs)
    if stages < 1 or stages > n:
        raise ValueError(f"cannot split {n} blocks into {stages} stages: every stage needs a block")
    cut = list(cut_cost) if cut_cost is not None else [0.0] * n
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(a: int, b: int) -> float:
        return prefix[b] - prefix[a] + (cut[b - 1] if b < n else 0.0)

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    back = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], cost(i, j))
                if v < best[k][j]:
                    best[k][j], back[k][j] = v, i
    bounds, j = [], n
    for k in range(stages, 0, -1):
        i = back[k][j]
        bounds.append((i, j))
        j = i
    return list(reversed(bounds))
