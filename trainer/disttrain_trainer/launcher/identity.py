"""Identity credentials of a local federated or parameter-server run: what the operator mints in a cluster.

One server key per run dir (kept across attempts, so a restarted server still
knows every credential); each client or worker process gets a folder holding only
the credentials of the identities it hosts, each server process the folder with
the server key. All processes run as one user on one machine, so the folders keep
the code path of the cluster, not a boundary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from disttrain_api import constants as C
from disttrain_api.identities import SERVER_KEY, hosted_clients, worker_id
from disttrain_api.model import JobSpec

from ..tensor_transport import auth
from .env import Slot

IDENTITY_DIR = "identity"
SERVER_ROLES = (C.ROLE_AGGREGATOR, C.ROLE_SERVER)


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def server_key(run_dir: Path) -> bytes:
    path = run_dir / IDENTITY_DIR / "server" / SERVER_KEY
    if path.exists():
        return auth.read_key(path)
    key = auth.new_key()
    _write_private(path, key.hex())
    return key


def identities_of(spec: JobSpec, rank: int) -> list[str]:
    """The identities gang process `rank` speaks for (client ids or its worker id)."""
    if spec.mode == "federated" and spec.federated is not None:
        return hosted_clients(spec.federated.clients, rank, spec.world_size)
    return [worker_id(rank)]


def provision(run_dir: Path, spec: JobSpec, envs: Sequence[tuple[Slot, dict[str, str]]]
              ) -> list[tuple[Slot, dict[str, str]]]:  # fmt: skip
    """`envs` with DISTTRAIN_IDENTITY_DIR set for every process, its folder written."""
    key = server_key(run_dir)
    root = run_dir / IDENTITY_DIR
    out = []
    for slot, env in envs:
        if env.get(C.ENV_ROLE) in SERVER_ROLES:
            folder = root / "server"
        else:
            folder = root / f"rank-{slot.rank}"
            for identity in identities_of(spec, slot.rank):
                _write_private(folder / identity, auth.credential(key, identity).hex())
        out.append((slot, {**env, C.ENV_IDENTITY_DIR: str(folder)}))
    return out
