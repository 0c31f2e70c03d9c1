"""The parameter-server run's settings: the spec's paramServer block plus the env contract, parsed once.

Env contract (set by the operator and by `disttrain local`):
  DISTTRAIN_ROLE         server | worker
  DISTTRAIN_SERVER_ADDR  host:port of every shard, comma-separated, shard 0 first; a server
                         process listens on the port of its own entry
  NODE_RANK              a server's shard index; a worker's pod index (RANK names the worker)
  DISTTRAIN_IDENTITY_DIR a server: the server key; a worker: its own credential (worker-<rank>)
  DISTTRAIN_TLS_DIR      optional: ca.crt (workers) or the server's key pair; unset = plaintext
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from disttrain_api import constants as C
from disttrain_api.identities import worker_id
from disttrain_api.model import JobSpec, ParamServerSpec

from ...process.config import ConfigError, TrainerConfig
from ...tensor_transport.channel import Tls

ROLES = (C.ROLE_SERVER, C.ROLE_WORKER)


@dataclass(frozen=True, kw_only=True)
class PSSettings:
    ps: ParamServerSpec
    role: str
    addrs: tuple[str, ...]  # shard i listens on addrs[i]
    index: int  # shard index (server) or worker index (worker)
    workers: int
    tls: Tls | None
    tls_server_name: str | None
    identity_dir: Path  # a server: the server key; a worker: its own credential

    @property
    def shards(self) -> int:
        return len(self.addrs)

    def listen_address(self) -> str:
        host, _, port = self.addrs[self.index].rpartition(":")
        # Tests and local runs stay on the loopback; in a pod the Service routes to any address.
        bind = host if host in ("127.0.0.1", "localhost", "[::1]") else "0.0.0.0"
        return f"{bind}:{port}"


__all__ = ["PSSettings", "load", "worker_id"]


def load(cfg: TrainerConfig, environ: Mapping[str, str] | None = None) -> PSSettings:
    env = os.environ if environ is None else environ
    spec: JobSpec = cfg.spec
    ps = spec.param_server or ParamServerSpec()
    role = env.get(C.ENV_ROLE) or ""
    if role not in ROLES:
        raise ConfigError(
            f"{C.ENV_ROLE}={role!r}: mode paramserver needs {' or '.join(ROLES)} "
            "(the operator and `disttrain local` set it)"
        )
    raw = env.get(C.ENV_SERVER_ADDR) or ",".join(f"127.0.0.1:{ps.port + i}" for i in range(ps.shards))
    addrs = tuple(a.strip() for a in raw.split(",") if a.strip())
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{C.ENV_SERVER_ADDR}={raw!r}: {a!r} must be host:port")
    if len(addrs) != ps.shards:
        raise ConfigError(
            f"{C.ENV_SERVER_ADDR} names {len(addrs)} servers but paramServer.shards is {ps.shards}"
        )
    if role == C.ROLE_SERVER:
        index = cfg.node_rank
        if not 0 <= index < ps.shards:
            raise ConfigError(f"{C.ENV_NODE_RANK}={index}: a server's shard index must be in [0, {ps.shards})")
    else:
        index = cfg.rank if cfg.rank is not None else cfg.node_rank * cfg.nproc_per_node
    identity_dir = env.get(C.ENV_IDENTITY_DIR)
    if not identity_dir:
        raise ConfigError(f"{C.ENV_IDENTITY_DIR} is not set: mode paramserver needs the folder of identity "
                          "credentials (the operator and `disttrain local` set it)")  # fmt: skip
    tls_dir = env.get(C.ENV_TLS_DIR)
    return PSSettings(ps=ps, role=role, addrs=addrs, index=index, workers=cfg.world_size,
                      tls=Tls(dir=Path(tls_dir)) if tls_dir else None,
                      tls_server_name=env.get(C.ENV_TLS_SERVER_NAME) or None, identity_dir=Path(identity_dir))  # fmt: skip
