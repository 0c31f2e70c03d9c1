"""An aggregator and its clients in one event loop, over real gRPC on 127.0.0.1.

For tests and benchmarks: the same servicer, round state machine, clients and
wire as the multi-process job, without process start-up. Each client group is
a ClientRunner with its own channel, as one client process would have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch
from disttrain_api.model import JobSpec
from torch import nn

from ...data import Dataset
from ...models import build_model  # noqa: F401 - re-exported for tests
from ...telemetry.federated_series import AGGREGATOR, FedMetrics
from ...tensor_transport.channel import Tls, add_port, aio_channel
from ...tensor_transport.limits import Limits
from . import serving
from .aggregator import Aggregator
from .client import ClientRunner
from .local_training import ClientState


@dataclass
class InProcessRun:
    aggregator: Aggregator
    runners: list[ClientRunner] = field(default_factory=list)
    port: int = 0


async def start_server(agg: Aggregator, tls: Tls | None = None, port: int = 0,
                       limits: Limits | None = None) -> tuple[grpc.aio.Server, int]:  # fmt: skip
    server = serving.build_server(agg, limits)
    port = add_port(server, f"127.0.0.1:{port}", tls)
    await server.start()
    return server, port


async def run_job(
    spec: JobSpec,
    ds: Dataset,
    groups: list[list[ClientState]],
    *,
    key: bytes,  # the server key; each runner derives its own clients' credentials from it
    evaluate: Callable[[dict[str, torch.Tensor]], float] | None = None,
    checkpoint_dir: Path | None = None,
    faults: dict[str, str] | None = None,
    make_model: Callable[[], nn.Module] | None = None,
    tls: Tls | None = None,
    tls_server_name: str | None = None,
    metrics: FedMetrics | None = None,
    on_start: Callable[[InProcessRun], None] | None = None,
    sampling_salt: bytes | None = None,  # runs compared on the same samples share it (and the key)
    log: Callable[[str], None] = lambda s: None,
) -> InProcessRun:
    """Play every round; returns when the aggregator is done and the clients have stopped."""
    assert spec.federated is not None
    builder = make_model or (lambda: build_model(spec, ds))
    agg = Aggregator(
        fed=spec.federated, model=builder().state_dict(), key=key,
        metrics=metrics or FedMetrics(job="inprocess", process=AGGREGATOR, port=0, log_path=None,
                                      private=spec.federated.privacy is not None),
        evaluate=evaluate, checkpoint_dir=checkpoint_dir, log=log,
        client_rows={st.cid: len(st.y) for g in groups for st in g},  # each client's partition
        sampling_salt=sampling_salt,
    )  # fmt: skip
    agg.restore()
    server, port = await start_server(agg, tls)
    run = InProcessRun(aggregator=agg, port=port)
    channels = [aio_channel(f"127.0.0.1:{port}", tls, tls_server_name) for _ in groups]
    try:
        run.runners = [
            ClientRunner(spec=spec, channel=ch, key=key, clients=g, make_model=builder, faults=faults,
                         patience_s=30.0, log=log)  # fmt: skip
            for ch, g in zip(channels, groups, strict=True)
        ]
        if on_start is not None:
            on_start(run)
        clients = [asyncio.create_task(r.run()) for r in run.runners]
        await agg.run()
        await agg.wait_clients_told(10.0)
        await asyncio.gather(*clients, return_exceptions=True)
    finally:
        for ch in channels:
            await ch.close()
        await server.stop(grace=0.5)
    return run
