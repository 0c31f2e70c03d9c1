"""Process-group setup and teardown: wait for the master's DNS name, pick the backend and device.

NCCL when CUDA is usable, gloo otherwise. A job that asked for GPUs and sees none
fails (exit 2) unless CPU fallback is allowed; without GPUs asked for, CPU is normal. In a
pod with procsPerWorker > 1 the launcher sets no RANK; `spawn_local_ranks`
starts one process per local rank with RANK = NODE_RANK * NPROC_PER_NODE + i, each forked from a
forkserver that imported torch once for all of them (as `spawn` would, the forkserver is a fresh
interpreter: nothing of this process's threads or state is forked; CUDA is first touched in a rank).

Errors here are transient unless they are the config's fault: a master that
does not resolve yet (its pod is still Pending) or a gang that does not join in
time raises `RendezvousError`, which exits FAILED so the gang is retried.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from disttrain_api import constants as C
from disttrain_api import exitcodes
from torch.multiprocessing.spawn import ProcessException

from . import stop_request
from .config import ConfigError, Fenced, TrainerConfig
from .rank_imports import PRELOAD

SPAWN_GRACE_S = 3.0  # peers that hit the same config error exit with it themselves within this
STOP_POLL_S = 0.5  # how often a pod's first process looks for a stop request while its local ranks run


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


class RendezvousError(RuntimeError):
    """The gang could not meet in time; transient (a peer pod may still be Pending), so retried."""


def retry_until(timeout_s: float, attempt: Callable[[float], None], *,
                errors: type[OSError] | tuple[type[OSError], ...], gave_up: Callable[[OSError], str],
                waiting: Callable[[OSError], None] | None = None) -> None:  # fmt: skip
    """Call `attempt(seconds left)` until it returns, after each of `errors` again with a backoff of
    0.2 s doubling to 2 s, for up to `timeout_s`; then RendezvousError(gave_up(the last error)).
    `waiting` hears the first failure (to say what the process waits for)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            attempt(deadline - time.monotonic())
            return
        except errors as e:
            if time.monotonic() >= deadline:
                raise RendezvousError(gave_up(e)) from None
            if waiting is not None:
                waiting(e)
                waiting = None
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 2.0)


def wait_for_master(addr: str, timeout_s: float) -> None:
    """Block until `addr` resolves: a peer pod's DNS record appears only once the pod runs."""
    retry_until(timeout_s, lambda _left: socket.getaddrinfo(addr, None), errors=socket.gaierror,
                gave_up=lambda e: (f"{C.ENV_MASTER_ADDR}={addr!r} did not resolve within {timeout_s:.0f}s ({e}); "
                                   "rank 0's pod may still be Pending, or its headless service is missing"))  # fmt: skip


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
    timeout_s = cfg.rendezvous_timeout_s
    wait_for_master(cfg.master_addr, timeout_s)
    if not dist.is_initialized():
        try:
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
                rank=cfg.rank,
                world_size=cfg.world_size,
                # Also the collectives' timeout: a peer that vanished mid-run fails us within it.
                timeout=dt.timedelta(seconds=timeout_s),
                device_id=device if device.type == "cuda" else None,
            )
        except dist.DistError as e:  # DistStoreError, DistNetworkError: the store never filled up
            raise RendezvousError(
                f"rank {cfg.rank}: the gang of {cfg.world_size} did not meet at "
                f"{cfg.master_addr}:{cfg.master_port} within {timeout_s:.0f}s ({str(e).splitlines()[0]})"
            ) from None
    return DistContext(
        rank=cfg.rank,
        world_size=cfg.world_size,
        local_rank=cfg.local_rank,
        device=device,
        backend=backend,
    )


# Objects that hold a process group (a DDP model's Reducer, a pipeline schedule, a device mesh,
# the error whose traceback holds them), kept until exit_process. Freeing the last of them
# runs the gloo process group's destructor, which joins gloo's worker threads while holding
# the GIL; a worker that is just dropping a finished collective (the final barrier's) must
# decref a Python-created tensor and waits for that GIL: the rank hangs after its work is
# done (measured: about one run in a hundred under load, the main thread in
# ~ProcessGroupGloo from ~Reducer, the worker in gil_scoped_acquire).
_kept_until_exit: list[object] = []


def keep_until_exit(obj: object) -> None:
    """Keep `obj` alive until the process leaves: see `_kept_until_exit`."""
    _kept_until_exit.append(obj)


def finish() -> None:
    """Leave the gang together after a successful run, then tear the process group down.

    The barrier keeps a rank that finishes first from destroying its process group
    and closing its sockets while a peer is still inside the last collective.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def cleanup() -> None:
    """Tear down after a failure: no barrier, a dead peer would never reach it."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End the process without running interpreter finalization.

    Once a DistributedDataParallel was built, the gloo process group and its worker
    threads (`pt_gloo_runloop`) outlive destroy_process_group: torch keeps a C++
    reference to it (measured: the threads survive destroy, `del` and gc.collect()).
    During finalization such a thread that releases a tensor needs the GIL, Python
    ends it with a forced unwind, and C++ aborts the whole process with "terminate
    called without an active exception" -- after the rank finished its work, so the
    launcher saw a crash (SIGABRT) and restarted a finished job. Everything worth
    keeping is written and closed by now; flush stdio and leave.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _spawned(local_rank: int, cfg: TrainerConfig, main: Callable[[TrainerConfig], Any]) -> None:
    stop_request.install()  # the pod's first process forwards SIGTERM here (spawn_local_ranks)
    child = cfg.for_local_rank(local_rank)
    os.environ[C.ENV_RANK] = str(child.rank)
    os.environ[C.ENV_LOCAL_RANK] = str(local_rank)
    try:
        main(child)
    except ConfigError as e:
        # torch.multiprocessing would turn any exception into exit 1 (retried);
        # a config error fails again on every retry, so it must reach the pod as CONFIG.
        print(f"disttrain-trainer: rank {child.rank}: {e}", file=sys.stderr, flush=True)
        exit_process(exitcodes.CONFIG)
    except Fenced as e:  # a replaced gang's rank: FENCED, not a failure to retry
        print(f"disttrain-trainer: rank {child.rank}: fenced: {e}", file=sys.stderr, flush=True)
        exit_process(exitcodes.FENCED)
    except stop_request.StopRequested as e:
        keep_until_exit(e)
        exit_process(exitcodes.STOPPED)
    exit_process(exitcodes.OK)


def _join_stopping(procs: Any) -> None:
    """Wait for every local rank of a stopping pod; raise StopRequested unless all finished."""
    for p in procs.processes:
        p.join()
    codes = [p.exitcode for p in procs.processes]
    if all(code == exitcodes.OK for code in codes):
        return  # the run ended before the request reached a check: it finished
    if any(code not in (exitcodes.OK, exitcodes.STOPPED) for code in codes):
        raise RuntimeError(f"local ranks exited {codes} while stopping")
    raise stop_request.StopRequested(f"local ranks {codes}")


def _forward_stop(procs: Any) -> None:
    """SIGTERM reaches only a container's first process: pass it on to the local ranks."""
    for p in procs.processes:
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)


def spawn_local_ranks(cfg: TrainerConfig, main: Callable[[TrainerConfig], Any]) -> None:
    """Run `main` in NPROC_PER_NODE processes; raises if any of them fails (the pod then fails as a whole).

    A local rank that exits CONFIG makes this raise ConfigError even when a peer
    failed first (it lost its connection to the rank that rejected the config).
    """
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":
        multiprocessing.get_context(method).set_forkserver_preload([__name__, *PRELOAD, main.__module__])
    procs = mp.start_processes(_spawned, args=(cfg, main), nprocs=cfg.nproc_per_node, join=False,
                               start_method=method)  # fmt: skip
    remove = stop_request.on_request(lambda: _forward_stop(procs))
    try:
        # Deferred: the local ranks save the step they stop at; this process waits for them.
        with stop_request.deferred():
            while True:
                ready = multiprocessing.connection.wait(list(procs.sentinels), timeout=STOP_POLL_S)
                if stop_request.requested() or exitcodes.STOPPED in [p.exitcode for p in procs.processes]:
                    # Asked here, or a peer in another pod was (its ranks stopped at the agreed step):
                    # every local rank stops and saves. procs.join would kill the others
                    # SPAWN_GRACE_S after the first exits, maybe mid-checkpoint: wait for each.
                    _join_stopping(procs)
                    return
                # The grace period lets every rank that hits the same config error exit with it itself.
                if ready and procs.join(grace_period=SPAWN_GRACE_S):
                    return
    except ProcessException:
        codes = [p.exitcode for p in procs.processes]
        if exitcodes.FENCED in codes:
            raise Fenced(f"local rank {codes.index(exitcodes.FENCED)} was fenced (see its message above)") from None
        if exitcodes.CONFIG in codes:
            raise ConfigError(
                f"local rank {codes.index(exitcodes.CONFIG)} rejected the config (see its message above)"
            ) from None
        raise
    finally:
        remove()
