"""The per-process environment of a local gang: the operator's env contract on one machine.

Pure functions (no processes, no torch) so the contract is unit-testable: which
rank gets which variables, which device, which ports.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disttrain_api import constants as C

from ..process.threads import THREADS_ENV, threads_per_rank

LOCALHOST = "127.0.0.1"
ENV_CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One training process: the identity a worker pod's process would have."""

    rank: int
    local_rank: int
    node_rank: int


def gang_slots(replicas: int, procs_per_worker: int) -> list[Slot]:
    # Rank order matches the operator: pod index major, local rank minor.
    return [
        Slot(rank=node * procs_per_worker + local, local_rank=local, node_rank=node)
        for node in range(replicas)
        for local in range(procs_per_worker)
    ]


@dataclass(frozen=True, kw_only=True)
class DevicePlan:
    device: str  # "cpu" or "cuda"
    # CUDA_VISIBLE_DEVICES per replica (node rank); None leaves the user's value alone.
    visible: tuple[str, ...] | None
    warning: str | None = None


def plan_devices(
    *, gpus: int, replicas: int, procs_per_worker: int, cuda_count: int, user_device: str | None
) -> DevicePlan:
    """Decide where the gang runs, as a cluster would give each worker pod its own GPUs.

    `user_device` is DISTTRAIN_DEVICE from the user's shell: "cpu" forces CPU,
    "cuda" asks for GPUs even when the manifest requests none.
    """
    if user_device == "cpu":
        return DevicePlan(device="cpu", visible=None)
    if cuda_count == 0:
        warning = None
        if gpus > 0 or user_device == "cuda":
            warning = (
                f"workers.resources.gpus={gpus} but CUDA is not available on this machine: "
                "running on CPU with gloo"
            )
        return DevicePlan(device="cpu", visible=None, warning=warning)
    if gpus == 0 and user_device != "cuda":
        # Pods without a GPU request see no GPU; keep local runs faithful to the manifest.
        return DevicePlan(device="cpu", visible=tuple("" for _ in range(replicas)))
    per_replica = gpus or procs_per_worker
    need = replicas * per_replica
    if cuda_count < need or procs_per_worker > per_replica:
        return DevicePlan(
            device="cpu",
            visible=tuple("" for _ in range(replicas)),
            warning=(
                f"the job needs {need} GPUs ({replicas} replicas x {per_replica}) with at most one "
                f"process per GPU, this machine has {cuda_count}: running on CPU with gloo"
            ),
        )
    visible = tuple(
        ",".join(str(d) for d in range(r * per_replica, (r + 1) * per_replica))
        for r in range(replicas)
    )
    return DevicePlan(device="cuda", visible=visible)


def template_env(template: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Literal `env` entries of workers.template (name/value); returns (env, warnings)."""
    env: dict[str, str] = {}
    warnings: list[str] = []
    entries = template.get("env") or []
    if not isinstance(entries, list):
        return env, ["spec.workers.template.env is not a list: ignored by disttrain local"]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            warnings.append(f"spec.workers.template.env[{i}] has no name: ignored")
        elif "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            warnings.append(
                f"spec.workers.template.env[{i}] ({entry['name']}) uses valueFrom, which only a "
                "cluster can resolve: ignored by disttrain local"
            )
    return env, warnings


def reserve_ports(count: int) -> list[int]:
    """Distinct free TCP ports on localhost (all bound at once, so none repeats)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOCALHOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def metrics_ports(option: int | None, world_size: int) -> list[int]:
    """Port each rank should serve /metrics on: None = free ports, 0 = off, N = N + rank."""
    if option is None:
        return reserve_ports(world_size)
    if option == 0:
        return [0] * world_size
    return [option + rank for rank in range(world_size)]


@dataclass(frozen=True, kw_only=True)
class GangEnv:
    """What all processes of one attempt share."""

    job: str
    world_size: int
    procs_per_worker: int
    master_port: int
    config_path: Path
    run_dir: Path
    checkpoint_dir: Path
    termination_log: Path
    restart_attempt: int
    device: DevicePlan
    threads: int


def default_threads(world_size: int, cpu_count: float | None = None) -> int:
    """Threads per rank of a local run: the CPUs this process may use (affinity, cgroup quota)
    shared by the ranks."""
    return threads_per_rank(world_size, cpu_count)


def process_env(
    base: Mapping[str, str], gang: GangEnv, slot: Slot, metrics_port: int
) -> dict[str, str]:
    """The environment of one process: the user's env, then the contract on top.

    The contract's variables always win (a stale RANK in the shell must not
    break the gang); OMP_NUM_THREADS only fills a gap. DISTTRAIN_DEVICE comes
    from the device plan, which already honoured the user's own setting.
    """
    env = dict(base)
    env.update(
        {
            C.ENV_MASTER_ADDR: LOCALHOST,
            C.ENV_MASTER_PORT: str(gang.master_port),
            C.ENV_WORLD_SIZE: str(gang.world_size),
            C.ENV_RANK: str(slot.rank),
            C.ENV_LOCAL_RANK: str(slot.local_rank),
            C.ENV_NODE_RANK: str(slot.node_rank),
            C.ENV_NPROC_PER_NODE: str(gang.procs_per_worker),
            C.ENV_JOB: gang.job,
            C.ENV_NAMESPACE: C.LOCAL_NAMESPACE,
            C.ENV_CONFIG: str(gang.config_path),
            C.ENV_RESTART_ATTEMPT: str(gang.restart_attempt),
            C.ENV_CHECKPOINT_DIR: str(gang.checkpoint_dir),
            C.ENV_RUN_DIR: str(gang.run_dir),
            C.ENV_TERMINATION_LOG: str(gang.termination_log),
            # The trainer serves base + LOCAL_RANK; choose base so the rank lands on its port.
            C.ENV_METRICS_PORT: str(metrics_port - slot.local_rank if metrics_port else 0),
            # Children's tracebacks and one-line errors reach the log files unbuffered.
            "PYTHONUNBUFFERED": "1",
        }
    )
    env[C.ENV_DEVICE] = gang.device.device
    # Set only when the user has not: one process per core share avoids the oversubscription that
    # makes N torch processes on N cores crawl.
    env.setdefault(THREADS_ENV, str(gang.threads))
    if gang.device.visible is not None:
        env[ENV_CUDA_VISIBLE] = gang.device.visible[slot.node_rank]
    return env


def federated_envs(
    envs: Sequence[tuple[Slot, dict[str, str]]], *, server_port: int, metrics_port: int
) -> list[tuple[Slot, dict[str, str]]]:
    """Mode federated: every gang process is a client process; one more, the aggregator, gets
    rank = world size (its log is rank{W}.log) and the env of rank 0 with its own role and port,
    as the operator's aggregator Deployment would."""
    addr = f"{LOCALHOST}:{server_port}"
    out = [(s, {**e, C.ENV_ROLE: C.ROLE_CLIENT, C.ENV_SERVER_ADDR: addr}) for s, e in envs]
    if not envs:
        return out
    first_slot, first = envs[0]
    agg = Slot(rank=len(envs), local_rank=0, node_rank=first_slot.node_rank)
    agg_env = {**first, C.ENV_ROLE: C.ROLE_AGGREGATOR, C.ENV_SERVER_ADDR: addr,
               C.ENV_METRICS_PORT: str(metrics_port)}  # fmt: skip
    return [(agg, agg_env), *out]


def paramserver_envs(
    envs: Sequence[tuple[Slot, dict[str, str]]], *, server_ports: Sequence[int], metrics_ports: Sequence[int]
) -> list[tuple[Slot, dict[str, str]]]:
    """Mode paramserver: every gang process is a worker; one server process per shard joins, with
    rank = world size + shard (its log is rank{W+i}.log), NODE_RANK = its shard index and the env of
    rank 0 with its own role and metrics port, as the operator's server Deployment would give it.
    Everyone gets the list of shard addresses, shard 0 first."""
    addrs = ",".join(f"{LOCALHOST}:{p}" for p in server_ports)
    out = [(s, {**e, C.ENV_ROLE: C.ROLE_WORKER, C.ENV_SERVER_ADDR: addrs}) for s, e in envs]
    if not envs:
        return out
    first_slot, first = envs[0]
    servers = [
        (Slot(rank=len(envs) + i, local_rank=0, node_rank=i),
         {**first, C.ENV_ROLE: C.ROLE_SERVER, C.ENV_SERVER_ADDR: addrs, C.ENV_NODE_RANK: str(i),
          C.ENV_METRICS_PORT: str(metrics_ports[i])})
        for i in range(len(server_ports))
    ]  # fmt: skip
    return [*servers, *out]


def trainer_command(python: str, extra: Sequence[str] = ()) -> list[str]:
    return [python, "-m", "disttrain_trainer", *extra]
