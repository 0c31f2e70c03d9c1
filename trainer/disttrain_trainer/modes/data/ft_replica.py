"""One fault-tolerant replica group's link to the others: torchft's Manager, its fault-tolerant
process group, the lighthouse it reports to and the transport a joining peer recovers through.

A replica group is one worker pod: one process (ddp), or procsPerWorker processes that shard the
model with FSDP2 (HSDP; validation: ft_rules.py). Its own process group (world size procsPerWorker)
is the ordinary torch.distributed one (dist_env.init_distributed, whose TCPStore the Managers
share); across replicas each process speaks with the processes of the same group rank in the other
groups, through its Manager and the fault-tolerant process group the Manager reconfigures: a
quorum from the lighthouse every quorumIntervalSteps (torchft forms it per replica group), the
gradient all-reduce over the quorum's members every step (sent to the process group directly:
parallel/ft_ddp.FTComm), and a commit vote the whole group takes together.

Timeouts (torchft's names): the process group's collectives time out after the job's
heartbeatTimeoutSeconds, so a silent peer (a partition, a frozen node) fails a step within it as a
dead one does at once; the Manager's own operations (the commit vote, the state transfer to a joining
peer) and the wait for a quorum get MANAGER_TIMEOUT_S, long enough to copy a model to a new replica.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from disttrain_api import constants as C
from disttrain_api.model import fault_tolerance as ft_model
from torchft import Manager
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.process_group import ProcessGroup, ProcessGroupGloo, ProcessGroupNCCL

from ...checkpoints import safe_state
from ...process.config import ConfigError, TrainerConfig
from ...process.dist_env import retry_until

NCCL_NONBLOCKING_TIMEOUT = "TORCH_NCCL_NONBLOCKING_TIMEOUT"
# The commit vote, the state transfer to a joining replica and the wait for a quorum (which waits for
# the lighthouse to drop a dead peer, or for one that is rank 0 of the quorum to finish a checkpoint).
MANAGER_TIMEOUT_S = 120.0
# The lighthouse waits this long for replicas that heartbeat but have not asked for the next quorum
# (a rank 0 writing a checkpoint, evaluating) before it forms one without them: longer than any of
# that, so the quorum does not shrink and grow back around a checkpoint.
JOIN_TIMEOUT_S = 60.0
# A replica retries the quorum this often when the lighthouse is unreachable (its pod restarting).
QUORUM_RETRIES = 3
# The most a joining replica reads from a peer: this many times the tensor bytes of its own state,
# plus the slack. A peer's state is the same model's: weights, optimizer moments (none yet in a
# fresh replica: Adam's two would make 3x its weights), and with DiLoCo the anchor and outer momentum.
RECEIVE_LIMIT_FACTOR = 8
RECEIVE_LIMIT_SLACK = 64 << 20


@dataclass(frozen=True, kw_only=True)
class ReplicaSettings:
    replica: int  # this replica's index (DISTTRAIN_FT_REPLICA: its worker pod)
    replicas: int  # spec.workers.replicas
    group_rank: int  # this process's rank in its replica group (RANK)
    group_size: int  # the group's processes (workers.procsPerWorker)
    lighthouse: str  # http://host:port
    host: str  # the address peers reach this replica at (MASTER_ADDR: its own pod, or 127.0.0.1)
    min_replicas: int
    heartbeat_timeout_s: float
    quorum_interval: int  # spec.faultTolerance.quorumIntervalSteps, or its default

    @property
    def replica_id(self) -> str:
        # torchft reads the trailing digits as the replica's index (its global rank).
        return f"replica_{self.replica}"

    @property
    def index(self) -> int:
        """This process's index in the job (its metrics rank, its data shard, its log in `disttrain local`)."""
        return self.replica * self.group_size + self.group_rank

    @property
    def processes(self) -> int:
        return self.replicas * self.group_size


def settings_for(cfg: TrainerConfig, env: Mapping[str, str] | None = None) -> ReplicaSettings:
    env = os.environ if env is None else env
    ft = cfg.spec.fault_tolerance
    if ft is None or not ft.enabled:
        raise ConfigError("spec.faultTolerance is not enabled: this is not a fault-tolerant replica")
    lighthouse = env.get(C.ENV_FT_LIGHTHOUSE) or ""
    if not lighthouse.startswith(("http://", "https://")):
        raise ConfigError(f"{C.ENV_FT_LIGHTHOUSE}={lighthouse!r}: a fault-tolerant replica needs the job's "
                          "lighthouse as http://host:port (the operator and `disttrain local` set it)")  # fmt: skip
    procs = cfg.spec.workers.procs_per_worker
    if cfg.world_size != procs:
        raise ConfigError(f"{C.ENV_WORLD_SIZE}={cfg.world_size}: a fault-tolerant replica group is its own world "
                          f"of workers.procsPerWorker={procs} processes")  # fmt: skip
    if cfg.rank is None or not 0 <= cfg.rank < procs:
        raise ConfigError(f"{C.ENV_RANK}={cfg.rank} must be this process's rank in its replica group, in [0, {procs})")
    raw = env.get(C.ENV_FT_REPLICA) or ""
    replicas = cfg.spec.workers.replicas
    if not raw.isdigit() or not 0 <= int(raw) < replicas:
        raise ConfigError(f"{C.ENV_FT_REPLICA}={raw!r} must be a replica index in [0, workers.replicas={replicas}) "
                          "(the operator and `disttrain local` set it)")  # fmt: skip
    return ReplicaSettings(replica=int(raw), replicas=replicas, group_rank=cfg.rank, group_size=procs,
                           lighthouse=lighthouse, host=cfg.master_addr, min_replicas=ft.min_replicas,
                           heartbeat_timeout_s=float(ft.heartbeat_timeout_seconds),
                           quorum_interval=ft.quorum_interval)  # fmt: skip


class _AdvertisedHTTPTransport(HTTPTransport):
    """torchft's HTTP checkpoint transport, with two changes.

    - Its server is reachable at the replica's own address: torchft names it by
      socket.gethostname(), which other pods cannot resolve (a pod's DNS name is host.subdomain).
    - What a joining replica receives is read with the weights-only unpickler. torchft unpickles it
      with the standard one (weights_only=False, for schedulers' state), which runs whatever the
      bytes name: any pod that gets itself chosen as the recovery source (by heartbeating to the
      lighthouse as a replica with the highest step) would run code in every replica that heals
      from it. The state sent here holds tensors and plain values only (`plain_state`); anything
      else is refused unread (safe_state.UnsafeCheckpoint), the step fails like a lost peer's, and
      the replica asks the next quorum. So is a stream larger than RECEIVE_LIMIT_FACTOR times this
      replica's own state (the peer's holds the same model; a fresh replica's optimizer holds no
      moments yet) and one that does not arrive within the transfer's timeout."""

    def __init__(self, host: str, timeout: timedelta, own_state: Callable[[], dict[str, Any]]) -> None:
        self._host = host  # before the base class starts its server: it logs address()
        self._own_state = own_state
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self) -> str:
        port = self._server.socket.getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{port}/checkpoint/"

    def _load_from_address(self, address: str, timeout: timedelta) -> object:  # type: ignore[override]
        limit = RECEIVE_LIMIT_FACTOR * safe_state.tensor_bytes(self._own_state()) + RECEIVE_LIMIT_SLACK
        with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:  # noqa: S310 - http:// only
            return safe_state.load_stream(f, f"the state a peer served at {address}", limit=limit,
                                          timeout_s=timeout.total_seconds())  # fmt: skip


def heartbeat_interval(timeout_s: float) -> timedelta:
    return timedelta(seconds=min(ft_model.HEARTBEAT_MAX_INTERVAL_S, timeout_s / ft_model.HEARTBEATS_PER_TIMEOUT))


def plain_state(state_dict: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """`state_dict` as the transport sends it: tensors and plain values (safe_state.plain), so that a
    value the receiver's weights-only loader would refuse fails here, naming its key."""
    return lambda: safe_state.plain(state_dict(), "the state sent to a joining replica")


class _OwnVote:
    """torchft's ManagerClient of a replica group of one process. The commit vote is a barrier of the
    group's processes at the group's Manager server, which answers "commit" when none of them voted
    against (manager.rs, should_commit). With one process the answer is that process's own vote, so
    it is given here, without the round trip to the server that every step would otherwise make.
    Everything else (the quorum) goes to torchft's client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def should_commit(self, group_rank: int, step: int, should_commit: bool, timeout: timedelta) -> bool:
        return should_commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _ResolvedQuorumManager(Manager):
    """torchft's Manager, asked about a quorum it already holds without the profiler's record.

    Its `wait_quorum` is wrapped in torch.profiler.record_function, which enters and leaves a
    dispatcher op on every call, profiler or not; num_participants, participating_rank and
    should_commit call it, five times a step in all. With use_async_quorum=False (open_manager)
    start_quorum returns with the quorum resolved, so every later call only reads it: here that
    read skips the record (about a tenth of the fault-tolerant step's Python time on the digits
    MLP). A quorum still pending (or none yet) goes to torchft's own."""

    def wait_quorum(self) -> None:
        future = self._quorum_future
        if future is not None and future.done():
            future.result()  # (re-raises the quorum's error, as torchft's does)
            return
        super().wait_quorum()


def wait_for_lighthouse(url: str, timeout_s: float) -> None:
    """Block until the job's lighthouse accepts a connection, for up to `timeout_s` (the job's
    rendezvous timeout, what a gang's workers wait for each other). The operator starts the
    lighthouse beside the workers, and on a busy cluster its pod can be ready tens of seconds after
    theirs: later than the Manager's connect timeout, which stays short because it is also how long a
    healing replica waits for a dead peer."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)

    def connect(left: float) -> None:
        socket.create_connection((host, port), timeout=max(0.1, min(5.0, left))).close()

    # OSError: not resolvable yet (its Service), refused (no ready pod), timed out
    retry_until(timeout_s, connect, errors=OSError,
                gave_up=lambda e: (f"the job's lighthouse at {url} did not accept a connection within "
                                   f"{timeout_s:.0f}s ({e}); on a cluster its pod is the Deployment "
                                   "<job>-lighthouse: see `kubectl describe deployment`"),
                waiting=lambda e: print(f"disttrain-trainer: waiting for the job's lighthouse at {url} ({e})",
                                        flush=True))  # fmt: skip


def replica_process_group(s: ReplicaSettings, *, cuda: bool) -> ProcessGroup:
    """The process group across the replicas (torchft's, which its Manager reconfigures at each new
    quorum): its collectives time out after heartbeatTimeoutSeconds.

    On CUDA, torchft's in-process ProcessGroupNCCL (torchtitan's choice too): non-blocking NCCL
    communicators, aborted with ncclCommAbort when a collective outlives the timeout (NCCL 2.25 or
    newer). Not ProcessGroupBabyNCCL (NCCL in a subprocess torchft starts with multiprocessing's
    spawn): measured on an H200 (torch 2.11, NCCL 2.28.9), its subprocess never reported its
    communicator ready to a trainer rank, which waited without end, while ProcessGroupNCCL was
    configured in 0.01 s and ran 100 all-reduces in 19 ms."""
    timeout = timedelta(seconds=s.heartbeat_timeout_s)
    if not cuda:
        return ProcessGroupGloo(timeout=timeout)
    # NCCL's own timeout for a non-blocking communicator's set-up: torchft sets it to the same value
    # when it is unset, with a warning in every replica's log.
    os.environ.setdefault(NCCL_NONBLOCKING_TIMEOUT, str(timeout.total_seconds()))
    return ProcessGroupNCCL(timeout=timeout)


def open_manager(cfg: TrainerConfig, s: ReplicaSettings, pg: ProcessGroup, *,
                 state_dict: Callable[[], dict[str, Any]],
                 load_state_dict: Callable[[dict[str, Any]], None]) -> Manager:  # fmt: skip
    """The Manager of this replica over `pg`: it starts heartbeating to the lighthouse now, so call it
    when the replica is ready to train (a replica that heartbeats is waited for by the others' quorum)."""
    timeout = timedelta(seconds=MANAGER_TIMEOUT_S)
    manager = _ResolvedQuorumManager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=plain_state(state_dict),
        min_replica_size=s.min_replicas,
        # Heal before the forward pass: a joining replica trains its first step on the peer's
        # weights (and LocalSGD/DiLoCo need it).
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timedelta(seconds=max(30.0, s.heartbeat_timeout_s)),
        rank=s.group_rank,
        world_size=s.group_size,
        store_addr=cfg.master_addr,
        store_port=cfg.master_port,
        lighthouse_addr=s.lighthouse,
        replica_id=s.replica_id,
        hostname=s.host,
        checkpoint_transport=_AdvertisedHTTPTransport(s.host, timeout, state_dict),
        # Every replica builds the same weights from data.seed (or model.init); one behind the others
        # (a replacement, a stale checkpoint) recovers from them whatever the step.
        init_sync=False,
        quorum_retries=QUORUM_RETRIES,
        heartbeat_interval=heartbeat_interval(s.heartbeat_timeout_s),
    )
    if s.group_size == 1:
        manager._client = _OwnVote(manager._client)  # noqa: SLF001 - torchft keeps its client private
    return manager
