"""The federated run's settings: the spec's federated block plus the env contract, parsed once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from disttrain_api import constants as C
from disttrain_api.model import FederatedSpec, JobSpec

from ..config import ConfigError, TrainerConfig
from ..tensor_transport.channel import Tls

ROLES = (C.ROLE_AGGREGATOR, C.ROLE_CLIENT)
# Without a mounted token key (disttrain local) the aggregator writes one here and
# its clients, which share the run dir, read it.
LOCAL_TOKEN_FILE = "federated-token.key"


@dataclass(frozen=True, kw_only=True)
class FedSettings:
    fed: FederatedSpec
    seed: int
    role: str
    server_addr: str  # host:port the aggregator listens on / clients dial
    tls: Tls | None
    tls_server_name: str | None
    token_key_file: Path
    token_key_mounted: bool  # False: the local run's aggregator creates the file

    @property
    def port(self) -> int:
        return int(self.server_addr.rsplit(":", 1)[1])


def client_ids(clients: int) -> list[str]:
    width = len(str(clients - 1))
    return [f"client-{i:0{width}d}" for i in range(clients)]


def hosted_clients(clients: int, index: int, processes: int) -> list[str]:
    """The clients process `index` of `processes` hosts: round-robin, so counts differ by <= 1."""
    return client_ids(clients)[index::processes]


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
    tls_dir = env.get(C.ENV_FED_TLS_DIR)
    key_file = env.get(C.ENV_FED_TOKEN_KEY_FILE)
    return FedSettings(
        fed=fed,
        seed=spec.data.seed,
        role=role,
        server_addr=addr,
        tls=Tls(dir=Path(tls_dir)) if tls_dir else None,
        tls_server_name=env.get(C.ENV_FED_TLS_SERVER_NAME) or None,
        token_key_file=Path(key_file) if key_file else cfg.run_dir / LOCAL_TOKEN_FILE,
        token_key_mounted=bool(key_file),
    )
