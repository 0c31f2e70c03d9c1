"""The identities that speak to a federated aggregator or a parameter server, and which pod holds which.

The operator mints one credential per identity and mounts into each pod only the
credentials of the identities that pod hosts; the trainer derives the very same
list to know which credentials it must find. Both sides call these functions, so
the split can never disagree.
"""

from __future__ import annotations

import hashlib
import hmac

# The file (and Secret key) holding the key every credential is derived from: only a server mounts it.
SERVER_KEY = "server.key"
_CREDENTIAL_DOMAIN = b"disttrain-credential-v1\n"


def credential(server_key: bytes, identity: str) -> bytes:
    """The credential of one identity: HMAC-SHA256(server key, identity), domain-separated."""
    return hmac.new(server_key, _CREDENTIAL_DOMAIN + identity.encode(), hashlib.sha256).digest()


def client_ids(clients: int) -> list[str]:
    width = len(str(clients - 1))
    return [f"client-{i:0{width}d}" for i in range(clients)]


def hosted_clients(clients: int, index: int, processes: int) -> list[str]:
    """The clients process `index` of `processes` hosts: round-robin, so counts differ by <= 1."""
    return client_ids(clients)[index::processes]


def pod_clients(clients: int, node_rank: int, procs_per_worker: int, world_size: int) -> list[str]:
    """Every client hosted by the processes of pod `node_rank` (ranks node_rank * procs + i)."""
    first = node_rank * procs_per_worker
    return sorted(c for r in range(first, first + procs_per_worker) for c in hosted_clients(clients, r, world_size))


def worker_id(index: int) -> str:
    return f"worker-{index}"


def worker_ids(workers: int) -> list[str]:
    return [worker_id(i) for i in range(workers)]
