"""An HSDP group stopped by SIGTERM: a process whose group peer left at the quorum while it was
already in the step's first collective stops on request too (exit STOPPED), not as a failure; a
peer that vanished without a request (killed) stays a failure."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from disttrain_trainer.modes.data import ft_quorum
from disttrain_trainer.parallel import fsdp
from disttrain_trainer.process import stop_request
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


def _peer_leaves(requested: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    model = fsdp.shard(model, init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",)))
    model(torch.randn(2, 16)).sum().backward()  # one whole step together
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)  # as at its quorum wait: at once, its connections closed by the kernel
    if requested:
        stop_request.request()
    try:
        with pytest.raises(stop_request.StopRequested if requested else RuntimeError) as raised:
            with ft_quorum.group_left_on_request(dist.get_world_size()):
                model(torch.randn(2, 16)).sum().backward()  # FSDP's all-gather with the departed peer
    finally:
        stop_request.reset()
    if requested:
        assert "a process of this replica group left first" in str(raised.value)
        assert isinstance(raised.value.__cause__, RuntimeError)  # gloo's read error, kept for the log


@pytest.mark.parametrize("requested", [True, False], ids=["asked-to-stop", "peer-killed"])
def test_a_collective_a_group_peer_left_is_the_stop_only_after_a_request(gloo, requested: bool) -> None:  # noqa: ANN001
    gloo(_peer_leaves, 2, requested)
