"""Process-group setup: wait for the master's DNS name, pick the backend and device.

NCCL when CUDA is usable, gloo otherwise. A job that asked for GPUs and sees none
fails (exit 2) unless CPU fallback is allowed; without GPUs asked for, CPU is normal. In a
pod with procsPerWorker > 1 the launcher sets no RANK; `spawn_local_ranks`
starts one process per local rank with RANK = NODE_RANK * NPROC_PER_NODE + i.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from disttrain_api import constants as C

from .config import ConfigError, TrainerConfig

RESOLVE_TIMEOUT_S = 120.0  # peer pods' DNS records appear a few seconds after the pods start
INIT_TIMEOUT = dt.timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def wait_for_master(addr: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            socket.getaddrinfo(addr, None)
            return
        except socket.gaierror as e:
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"{C.ENV_MASTER_ADDR}={addr!r} did not resolve within {timeout_s:.0f}s ({e}); "
                    "check the headless service of rank 0"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def pick_device(cfg: TrainerConfig) -> torch.device:
    want = cfg.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{C.ENV_DEVICE}=cuda but CUDA is not available in this process")
    gpus = cfg.spec.workers.resources.gpus
    if want is None and gpus > 0 and not torch.cuda.is_available():
        # A GPU job that silently trains on CPU looks healthy and is 10-100x slower: refuse,
        # unless the job or the operator allowed the fallback (clusters with advertised but
        # absent GPUs, such as the local cluster and kind).
        why = (f"spec.workers.resources.gpus={gpus} but this process sees no CUDA device "
               f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'})")
        if not cfg.allow_cpu_fallback:
            raise ConfigError(
                f"{why}; run a CUDA trainer image on nodes with the NVIDIA device plugin, or set "
                f"spec.workers.allowCPUFallback: true (or {C.ENV_ALLOW_CPU_FALLBACK}=true) to train on CPU"
            )
        warnings.warn(f"{why}; training on CPU (CPU fallback allowed)", stacklevel=2)
    if want == "cuda" or (want is None and torch.cuda.is_available()):
        index = cfg.local_rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_distributed(cfg: TrainerConfig) -> DistContext:
    if cfg.rank is None:
        raise ConfigError(
            "init_distributed needs a rank; spawn_local_ranks assigns one per process"
        )
    device = pick_device(cfg)
    backend = "nccl" if device.type == "cuda" else "gloo"
    wait_for_master(cfg.master_addr)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=INIT_TIMEOUT,
            device_id=device if device.type == "cuda" else None,
        )
    return DistContext(
        rank=cfg.rank,
        world_size=cfg.world_size,
        local_rank=cfg.local_rank,
        device=device,
        backend=backend,
    )


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _spawned(local_rank: int, cfg: TrainerConfig, main: Callable[[TrainerConfig], Any]) -> None:
    child = cfg.for_local_rank(local_rank)
    os.environ[C.ENV_RANK] = str(child.rank)
    os.environ[C.ENV_LOCAL_RANK] = str(local_rank)
    main(child)


def spawn_local_ranks(cfg: TrainerConfig, main: Callable[[TrainerConfig], Any]) -> None:
    """Run `main` in NPROC_PER_NODE processes; raises if any of them fails (the pod then fails as a whole)."""
    import torch.multiprocessing as mp  # noqa: PLC0415

    mp.start_processes(
        _spawned, args=(cfg, main), nprocs=cfg.nproc_per_node, join=True, start_method="spawn"
    )
