"""A fault-tolerant HSDP group's step reports FSDP's collectives among its own processes as
communication (the profiler's busy and exposed time), beside the quorum and the commit vote, as
plain FSDP's steps do: without it they would count as compute."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from disttrain_trainer.parallel import fsdp
from disttrain_trainer.parallel.comm_profile import ProfiledComm
from disttrain_trainer.parallel.ft_ddp import FTComm
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

COORDINATION_S = 0.25  # a quorum and a vote, as the loop adds them


def _group_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = fsdp.shard(model, init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",)))
    manager: Any = None  # the replicas' all-reduce is not part of this check
    comm = FTComm(manager, profiled=ProfiledComm(every=1))
    for _ in range(2):
        with comm.step():
            model(torch.randn(8, 64)).sum().backward()
        comm.add_coordination(COORDINATION_S)
        times = comm.take()
        kinds = comm.profiled.taken.by_kind if comm.profiled is not None else {}
        # FSDP2's parameter all-gather and its gradient reduction (on gloo: an all-reduce; there is
        # no all-reduce over the replicas in this check, so it is the group's).
        assert "all_gather" in kinds and {"all_reduce", "reduce_scatter"} & set(kinds), kinds
        group_busy = times.busy_s - COORDINATION_S
        assert group_busy > 0 and 0 < times.exposed_s - COORDINATION_S <= group_busy + 1e-9


def test_an_hsdp_groups_own_collectives_are_communication(gloo) -> None:  # noqa: ANN001
    gloo(_group_step, 2)
