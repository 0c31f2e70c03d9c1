"""This host's all-reduce link with N local gloo ranks: `disttrain explain --probe-host`.

A job's own probe (scaling_record.probe_link) measures the link between its ranks at its size.
On one CPU host that link changes with the number of ranks sharing the cores in a way no
smaller run shows: with more gloo processes than cores, every hop of a ring waits for its
receiver to be scheduled (measured on a 2-core VM: a 4 KiB all-reduce took 0.14 ms between 2
processes, 2.7 ms between 4). So a forecast that keeps all ranks on this host can measure
the host instead: N processes, one compute thread each, the same probe, no training.
"""

from __future__ import annotations

import os
import socket
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, out: Any) -> None:
    import torch  # noqa: PLC0415 - torch, in the spawned process only
    import torch.distributed as dist  # noqa: PLC0415 - torch

    from ..telemetry.scaling_record import probe_link  # noqa: PLC0415 - torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        link = probe_link(torch.device("cpu"), world)
        if rank == 0:
            out.put(link)
    finally:
        dist.destroy_process_group()


def probe_host(ranks: int) -> dict[str, Any]:
    """The probe's link dict (alphaS, betaBytesPerS, worldSize, ...) for `ranks` local gloo processes."""
    if ranks < 2:
        raise ValueError(f"a link needs two ranks or more (got {ranks})")
    import torch.multiprocessing as mp  # noqa: PLC0415 - torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(ranks, _free_port(), out), nprocs=ranks, join=True, start_method="spawn")
    return out.get()
