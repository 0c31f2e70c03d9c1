"""One fault-tolerant replica group's link to the others: torchft's Manager, its fault-tolerant
process group, the lighthouse it reports to and the transport a joining peer recovers through.

A replica group is one worker pod (one process, validation: ft_rules.py). Its own process group
(world size 1) is the ordinary torch.distributed one (dist_env.init_distributed, whose TCPStore the
Manager shares); across replicas only the Manager speaks: per step a quorum from the lighthouse, the
gradient all-reduce over the quorum's members, and a commit vote.

Timeouts (torchft's names): the process group's collectives time out after the job's
heartbeatTimeoutSeconds, so a silent peer (a partition, a frozen node) fails a step within it as a
dead one does at once; the Manager's own operations (the commit vote, the state transfer to a joining
peer) and the wait for a quorum get MANAGER_TIMEOUT_S, long enough to copy a model to a new replica.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from disttrain_api import constants as C
from torchft import Manager
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.process_group import ProcessGroupBabyNCCL, ProcessGroupGloo

from ...process.config import ConfigError, TrainerConfig

# The commit vote, the state transfer to a joining replica and the wait for a quorum (which waits for
# the lighthouse to drop a dead peer, or for one that is rank 0 of the quorum to finish a checkpoint).
MANAGER_TIMEOUT_S = 120.0
# The lighthouse waits this long for replicas that heartbeat but have not asked for the next quorum
# (a rank 0 writing a checkpoint, evaluating) before it forms one without them: longer than any of
# that, so the quorum does not shrink and grow back around a checkpoint.
JOIN_TIMEOUT_S = 60.0
# A replica retries the quorum this often when the lighthouse is unreachable (its pod restarting).
QUORUM_RETRIES = 3


@dataclass(frozen=True, kw_only=True)
class ReplicaSettings:
    replica: int  # this replica's index (NODE_RANK: its worker pod)
    replicas: int  # spec.workers.replicas
    lighthouse: str  # http://host:port
    host: str  # the address peers reach this replica at (MASTER_ADDR: its own pod, or 127.0.0.1)
    min_replicas: int
    heartbeat_timeout_s: float

    @property
    def replica_id(self) -> str:
        # torchft reads the trailing digits as the replica's index (its global rank).
        return f"replica_{self.replica}"


def settings_for(cfg: TrainerConfig, env: Mapping[str, str] | None = None) -> ReplicaSettings:
    env = os.environ if env is None else env
    ft = cfg.spec.fault_tolerance
    if ft is None or not ft.enabled:
        raise ConfigError("spec.faultTolerance is not enabled: this is not a fault-tolerant replica")
    lighthouse = env.get(C.ENV_FT_LIGHTHOUSE) or ""
    if not lighthouse.startswith(("http://", "https://")):
        raise ConfigError(f"{C.ENV_FT_LIGHTHOUSE}={lighthouse!r}: a fault-tolerant replica needs the job's "
                          "lighthouse as http://host:port (the operator and `disttrain local` set it)")  # fmt: skip
    if cfg.world_size != 1:
        raise ConfigError(f"{C.ENV_WORLD_SIZE}={cfg.world_size}: a fault-tolerant replica group is one process "
                          "(its own world of size 1)")  # fmt: skip
    if not 0 <= cfg.node_rank < cfg.spec.workers.replicas:
        raise ConfigError(f"{C.ENV_NODE_RANK}={cfg.node_rank} must be a replica index in [0, "
                          f"workers.replicas={cfg.spec.workers.replicas})")  # fmt: skip
    return ReplicaSettings(replica=cfg.node_rank, replicas=cfg.spec.workers.replicas, lighthouse=lighthouse,
                           host=cfg.master_addr, min_replicas=ft.min_replicas,
                           heartbeat_timeout_s=float(ft.heartbeat_timeout_seconds))  # fmt: skip


class _AdvertisedHTTPTransport(HTTPTransport):
    """torchft's HTTP checkpoint server, reachable at the replica's own address: torchft names it by
    socket.gethostname(), which other pods cannot resolve (a pod's DNS name is host.subdomain)."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self._host = host  # before the base class starts its server: it logs address()
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{port}/checkpoint/"


def open_manager(cfg: TrainerConfig, s: ReplicaSettings, *, cuda: bool,
                 state_dict: Callable[[], dict[str, Any]],
                 load_state_dict: Callable[[dict[str, Any]], None]) -> Manager:  # fmt: skip
    """The Manager of this replica: it starts heartbeating to the lighthouse now, so call it when the
    replica is ready to train (a replica that heartbeats is waited for by the others' quorum)."""
    timeout = timedelta(seconds=MANAGER_TIMEOUT_S)
    pg_timeout = timedelta(seconds=s.heartbeat_timeout_s)
    pg = ProcessGroupBabyNCCL(timeout=pg_timeout) if cuda else ProcessGroupGloo(timeout=pg_timeout)
    return Manager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=s.min_replicas,
        # Heal before the forward pass: a joining replica trains its first step on the peer's
        # weights (and LocalSGD/DiLoCo need it).
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timedelta(seconds=max(30.0, s.heartbeat_timeout_s)),
        rank=0,
        world_size=1,
        store_addr=cfg.master_addr,
        store_port=cfg.master_port,
        lighthouse_addr=s.lighthouse,
        replica_id=s.replica_id,
        hostname=s.host,
        checkpoint_transport=_AdvertisedHTTPTransport(s.host, timeout),
        # Every replica builds the same weights from data.seed (or model.init); one behind the others
        # (a replacement, a stale checkpoint) recovers from them whatever the step.
        init_sync=False,
        quorum_retries=QUORUM_RETRIES,
    )
