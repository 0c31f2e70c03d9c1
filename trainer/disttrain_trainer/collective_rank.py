"""One rank of a collective run (the data and pipeline modes): its threads, process group,
metrics, dataset and model, set up in that order and torn down when the run leaves.

A run that returns leaves the gang together (dist_env.finish: a barrier, then the process group
is destroyed); one that raises tears down without the barrier a dead peer would never reach.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .data import Dataset, load_dataset
from .models import build_model
from .parallel.model_contract import check_model_contract
from .process.config import TrainerConfig
from .process.dist_env import DistContext, cleanup, finish, init_distributed, spawn_local_ranks
from .process.precision import Amp, make_amp
from .process.threads import THREADS_ENV, threads_per_rank
from .telemetry.step_metrics import Metrics
from .tracking.tracker import target_for


@dataclass(frozen=True, kw_only=True)
class Rank:
    ctx: DistContext
    metrics: Metrics
    ds: Dataset
    amp: Amp
    model: nn.Module  # built from the spec, not wrapped or split yet


def _threads(cfg: TrainerConfig) -> int:
    """Threads per rank from the pod's CPUs (quota, affinity), not the node's cores."""
    local = cfg.master_addr in ("127.0.0.1", "localhost", "::1")
    return threads_per_rank(cfg.world_size if local else cfg.nproc_per_node)


def _set_threads(cfg: TrainerConfig) -> None:
    if not os.environ.get(THREADS_ENV):
        torch.set_num_threads(_threads(cfg))


ModelCheck = Callable[[nn.Module, Dataset], None]  # raises the mode's ConfigError for a model it cannot run


@contextmanager
def collective_rank(cfg: TrainerConfig, metrics: Metrics | None = None, *,
                    check_model: ModelCheck | None = None) -> Iterator[Rank]:  # fmt: skip
    """Set this rank up; `metrics` given: the caller's (it closes them), else the rank's own.
    `check_model`: what the mode asks of the model beyond the layout's contract (model_contract),
    run on every rank with the contract, before the mode's first collective."""
    _set_threads(cfg)
    spec = cfg.spec
    ctx = init_distributed(cfg)
    own_metrics = metrics is None
    m = metrics or Metrics(
        job=cfg.job, rank=ctx.rank, mode=spec.mode, port=cfg.metrics_port, run_dir=cfg.run_dir,
        namespace=cfg.namespace, target_steps=spec.training.steps,
        tracking=target_for(cfg) if ctx.rank == 0 else None,  # rank 0 sees the whole job
    )
    finished = False
    try:
        if ctx.local_rank == 0:  # one rank per machine packs the shards; the others then just map them
            ds = load_dataset(spec)
        dist.barrier()
        if ctx.local_rank != 0:
            ds = load_dataset(spec)
        amp = make_amp(spec.training.precision, ctx.device)
        model = build_model(spec, ds)
        check_model_contract(spec, model)  # every rank alike, before the mode's first collective
        if check_model is not None:
            check_model(model, ds)
        yield Rank(ctx=ctx, metrics=m, ds=ds, amp=amp, model=model)
        finished = True
    finally:
        if own_metrics:
            m.close()  # the HTTP server thread first: nothing may outlive the process group
        if finished:
            finish()
        else:
            cleanup()


def run_local_ranks(cfg: TrainerConfig, run: Callable[[TrainerConfig], Any]) -> Any:
    """This pod's ranks: `run` in NPROC_PER_NODE spawned processes when the launcher set no RANK
    (returns None), else in this process (returns what `run` returns). `run` must be importable
    by name, so the spawned children can unpickle it."""
    if cfg.rank is None and cfg.nproc_per_node > 1:
        # In the environment before the local ranks' forkserver imports torch: torch's thread pools
        # read it at import, and a fork then set to another count may compute differently.
        os.environ.setdefault(THREADS_ENV, str(_threads(cfg)))
        spawn_local_ranks(cfg, run)
        return None
    return run(cfg if cfg.rank is not None else cfg.for_local_rank(0))
