"""Which server shard holds which tensor: by whole tensor, largest first onto the least-loaded shard.

A pure function of the names and sizes, so every worker and every server computes
the same map without asking anyone. Ties go to the lower shard index.
"""

from __future__ import annotations

from collections.abc import Mapping


def assign(sizes: Mapping[str, int], shards: int) -> list[list[str]]:
    """Tensor names per shard (each list in the model's order)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if len(sizes) < shards:
        raise ValueError(
            f"paramServer.shards={shards} exceeds the model's {len(sizes)} tensors; "
            "a shard would hold nothing (lower paramServer.shards)"
        )
    order = list(sizes)
    rank = {n: i for i, n in enumerate(order)}
    load = [0] * shards
    owner: dict[str, int] = {}
    for name in sorted(order, key=lambda n: (-sizes[n], rank[n])):
        i = min(range(shards), key=lambda k: (load[k], k))
        owner[name] = i
        load[i] += sizes[name]
    return [[n for n in order if owner[n] == i] for i in range(shards)]
