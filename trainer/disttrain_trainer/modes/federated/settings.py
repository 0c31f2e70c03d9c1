"""The federated run's settings: the spec's federated block plus the env contract, parsed once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from disttrain_api import constants as C
from disttrain_api.identities import client_ids, hosted_clients
from disttrain_api.model import FederatedSpec, JobSpec

from ...process.config import ConfigError, TrainerConfig
from ...tensor_transport.channel import Tls

ROLES = (C.ROLE_AGGREGATOR, C.ROLE_CLIENT)


@dataclass(frozen=True, kw_only=True)
class FedSettings:
    fed: FederatedSpec
    role: str
    server_addr: str  # host:port the aggregator listens on / clients dial
    tls: Tls | None
    tls_server_name: str | None
    identity_dir: Path  # the aggregator: the server key; a client process: its clients' credentials

    @property
    def port(self) -> int:
        return int(self.server_addr.rsplit(":", 1)[1])


__all__ = ["FedSettings", "client_ids", "hosted_clients", "load"]


def load(cfg: TrainerConfig, environ: Mapping[str, str] | None = None) -> FedSettings:
    env = os.environ if environ is None else environ
    spec: JobSpec = cfg.spec
    fed = spec.federated or FederatedSpec()
    role = env.get(C.ENV_ROLE) or ""
    if role not in ROLES:
        raise ConfigError(
            f"{C.ENV_ROLE}={role!r}: mode federated needs {' or '.join(ROLES)} "
            "(the operator and `disttrain local` set it)"
        )
    addr = env.get(C.ENV_SERVER_ADDR) or f"127.0.0.1:{fed.port}"
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{C.ENV_SERVER_ADDR}={addr!r} must be host:port")
    tls_dir = env.get(C.ENV_TLS_DIR)
    identity_dir = env.get(C.ENV_IDENTITY_DIR)
    if not identity_dir:
        raise ConfigError(f"{C.ENV_IDENTITY_DIR} is not set: mode federated needs the folder of identity "
                          "credentials (the operator and `disttrain local` set it)")  # fmt: skip
    return FedSettings(
        fed=fed,
        role=role,
        server_addr=addr,
        tls=Tls(dir=Path(tls_dir)) if tls_dir else None,
        tls_server_name=env.get(C.ENV_TLS_SERVER_NAME) or None,
        identity_dir=Path(identity_dir),
    )
