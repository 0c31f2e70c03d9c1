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


def one_f_one_b(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Stage `stage`'s order of work in 1F1B: ("F" | "B", micro-batch). It runs stages - stage - 1
    forwards ahead (warm-up), then alternates one forward with one backward, then drains."""
    warm = min(microbatches, stages - stage - 1)
    order = [("F", j) for j in range(warm)]
    f = warm
    for b in range(microbatches):
        if f < microbatches:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
    return order


def time_shared_makespan(forward_s: Sequence[float], backward_s: Sequence[float], *, microbatches: int,
                         cores: float, message_s: float) -> float:  # fmt: skip
    """The 1F1B schedule's makespan when its stages share `cores` cores (fewer than the stages).

    The formula above assumes a core per stage. On a shared host the scheduler divides the cores
    fairly among the stages that can run: with k runnable, each advances at min(1, cores / k) of
    full speed, so a stage waiting in the bubble gives its share to the others, and a stage on
    the critical path slows whenever more than `cores` can run. That is processor sharing over
    the schedule's dependency graph (forward j of stage s after forward j of stage s - 1, its
    backward after backward j of stage s + 1 or, on the last stage, after its own forward, each
    stage in its 1F1B order); with a message crossing a boundary `message_s` after it was sent
    (a delay, not work: the sender's core goes on). This simulates it event by event.

    `forward_s`, `backward_s`: each stage's seconds per micro-batch at full speed. With cores
    >= stages nothing is shared and the result is the dependency graph's longest path."""
    p = len(forward_s)
    if p == 0:
        return 0.0
    m = max(1, microbatches)
    orders = [one_f_one_b(p, m, s) for s in range(p)]
    nxt = [0] * p  # index of each stage's next task in its order
    left: list[float | None] = [None] * p  # work left of the task a stage has started
    finished: dict[tuple[str, int, int], float] = {}
    t = 0.0

    def ready_time(s: int) -> float | None:
        """When stage s's next task may start (its inputs arrived), or None while they are unsent."""
        kind, j = orders[s][nxt[s]]
        if kind == "F":
            if s == 0:
                return 0.0
            sent = finished.get(("F", s - 1, j))
            return None if sent is None else sent + message_s
        if s == p - 1:
            return finished.get(("F", s, j))
        sent = finished.get(("B", s + 1, j))
        return None if sent is None else sent + message_s

    while any(nxt[s] < len(orders[s]) for s in range(p)):
        running, wake = [], float("inf")
        for s in range(p):
            if nxt[s] >= len(orders[s]):
                continue
            if left[s] is None:
                at = ready_time(s)
                if at is None:
                    continue
                if at > t:
                    wake = min(wake, at)
                    continue
                kind, _ = orders[s][nxt[s]]
                left[s] = forward_s[s] if kind == "F" else backward_s[s]
            running.append(s)
        if not running:
            if wake == float("inf"):
                raise ValueError("pipeline schedule deadlocked: no stage can run")  # unreachable for 1F1B
            t = wake
            continue
        rate = min(1.0, cores / len(running))
        dt = min(min(left[s] or 0.0 for s in running) / rate, wake - t)
        t += dt
        for s in running:
            rest = (left[s] or 0.0) - dt * rate
            if rest <= 1e-12:
                finished[(orders[s][nxt[s]][0], s, orders[s][nxt[s]][1])] = t
                nxt[s] += 1
                left[s] = None
            else:
                left[s] = rest
    return t


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
