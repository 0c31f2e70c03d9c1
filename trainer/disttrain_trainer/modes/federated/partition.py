"""Split the training rows over clients: IID, or label-skewed by Dirichlet(alpha) (non-IID).

Every client process computes the same split from the seed and keeps only its
own clients' rows, so no coordinator has to hand them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from disttrain_api.model import FedPartition

# Redraw a Dirichlet split that leaves a client with fewer rows than this
# (the usual recipe, e.g. Hsu et al. 2019): an empty client cannot train.
MIN_ROWS_PER_CLIENT = 10
MAX_DRAWS = 1000


def iid(num_rows: int, clients: int, seed: int) -> list[np.ndarray]:
    perm = np.random.default_rng(seed).permutation(num_rows)
    return [np.sort(p) for p in np.array_split(perm, clients)]


def dirichlet(labels: np.ndarray, clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Per class, proportions over clients ~ Dir(alpha): small alpha gives each client few classes."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    classes = np.unique(labels)
    floor = min(MIN_ROWS_PER_CLIENT, len(labels) // clients)
    for _ in range(MAX_DRAWS):
        parts: list[list[int]] = [[] for _ in range(clients)]
        for k in classes:
            rows = rng.permutation(np.flatnonzero(labels == k))
            p = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(rows)).astype(int)
            for c, piece in enumerate(np.split(rows, cuts)):
                parts[c].extend(piece.tolist())
        if min(len(p) for p in parts) >= floor:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) split gives each of {clients} clients {floor} rows; "
        "raise partition.alpha or lower federated.clients"
    )


def split(num_rows: int, labels: np.ndarray | None, clients: int, part: FedPartition, seed: int) -> list[np.ndarray]:
    """Client i's rows (sorted indices into the training set) at index i, as the spec asks: the
    client processes keep their own clients' rows, the aggregator only counts them (a client's
    sample weight is capped at its own partition's size)."""
    if part.kind == "dirichlet" and labels is not None:
        return dirichlet(labels, clients, part.alpha, seed)
    return iid(num_rows, clients, seed)
