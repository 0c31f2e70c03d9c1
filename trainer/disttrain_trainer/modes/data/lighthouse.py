"""Role lighthouse: the job's torchft lighthouse, which forms the quorum of fault-tolerant replicas.

One per job (the operator's Deployment + Service, `disttrain local`'s own process): its settings
are the job's (spec.faultTolerance: minReplicas, heartbeatTimeoutSeconds), which a lighthouse
shared by several jobs could not honour. It keeps no state worth saving: restarted, it learns the
replicas again from their next heartbeats. It serves until SIGTERM and then exits 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlparse

from disttrain_api import constants as C

from ...process import stop_request
from ...process.config import ConfigError, TrainerConfig
from .ft_replica import JOIN_TIMEOUT_S

QUORUM_TICK_MS = 100


def port_of(env: Mapping[str, str]) -> int:
    """The port the lighthouse listens on: the one in its own address (TORCHFT_LIGHTHOUSE)."""
    url = env.get(C.ENV_FT_LIGHTHOUSE) or f"http://0.0.0.0:{C.DEFAULT_LIGHTHOUSE_PORT}"
    try:
        port = urlparse(url).port
    except ValueError:
        port = None
    if port is None:
        raise ConfigError(f"{C.ENV_FT_LIGHTHOUSE}={url!r} must be http://host:port")
    return port


def serve(cfg: TrainerConfig, env: Mapping[str, str] | None = None) -> None:
    from torchft.coordination import LighthouseServer  # noqa: PLC0415 - torchft (only this role)

    ft = cfg.spec.fault_tolerance
    if ft is None or not ft.enabled:
        raise ConfigError(f"{C.ENV_ROLE}={C.ROLE_LIGHTHOUSE} needs spec.faultTolerance")
    port = port_of(os.environ if env is None else env)
    with stop_request.deferred():
        server = LighthouseServer(
            bind=f"[::]:{port}",
            min_replicas=ft.min_replicas,
            join_timeout_ms=int(JOIN_TIMEOUT_S * 1000),
            quorum_tick_ms=QUORUM_TICK_MS,
            heartbeat_timeout_ms=ft.heartbeat_timeout_seconds * 1000,
        )
        print(f"disttrain-trainer: lighthouse of job {cfg.job} on port {port} (minReplicas {ft.min_replicas}, "
              f"heartbeat timeout {ft.heartbeat_timeout_seconds} s)", flush=True)  # fmt: skip
        try:
            stop_request.event.wait()
        finally:
            server.shutdown()
