"""`python -m disttrain_trainer` in mode federated: build what a role needs and run it.

On SIGTERM (process/stop_request.py) the aggregator stops between or inside a round: every finished
round is checkpointed before the next one starts (a save in flight completes: asyncio.run
waits for its thread), so a resumed aggregator redoes at most the round it was in. A client
process stops at once: its clients keep no state of their own between rounds.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import torch
from disttrain_api import constants as C
from disttrain_api.identities import SERVER_KEY

from ...checkpoints.fence import Writer
from ...data import Dataset, load_dataset
from ...models import build_model
from ...process import serve_until_stopped, stop_request
from ...process.config import ConfigError, TrainerConfig
from ...process.precision import make_amp
from ...process.threads import THREADS_ENV, threads_per_rank
from ...run_common import Summary, evaluate, write_summary, write_termination_message
from ...telemetry.federated_series import AGGREGATOR, FedMetrics
from ...tensor_transport import auth
from ...tensor_transport.channel import add_port, aio_channel
from ...tracking.tracker import target_for
from ...weights.export import write_export
from . import partition, serving
from .aggregator import Aggregator
from .client import ClientRunner
from .local_training import ClientState
from .settings import FedSettings, client_ids, hosted_clients, load

AGGREGATOR_LOG = C.RANK_METRICS_FILENAME.format(rank=0)  # the launcher follows rank 0's log for progress and the plot
DONE_LINGER_S = 10.0  # after the last round: time for clients to hear "done"


def main(cfg: TrainerConfig) -> Summary | None:
    """The mode's entry (modes/__init__.py): the role DISTTRAIN_ROLE names."""
    s = load(cfg)
    if not os.environ.get(THREADS_ENV):
        torch.set_num_threads(threads_per_rank(cfg.world_size + 1))  # the pod's CPUs, not the node's
    if s.role == C.ROLE_AGGREGATOR:
        return run_aggregator(cfg, s)
    summary = run_clients(cfg, s)
    if summary is not None and process_indices(cfg)[0] == 0 and cfg.termination_log is not None:
        # Client process 0 is the gang's rank 0: its termination message carries the job's
        # result to the operator, as in every other mode.
        write_termination_message(cfg.termination_log, summary)
    return summary


# ------------------------------------------------------------------ credentials


def aggregator_key(s: FedSettings) -> bytes:
    path = s.identity_dir / SERVER_KEY
    try:
        return auth.read_key(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"the aggregator's server key: {e} ({C.ENV_IDENTITY_DIR}={s.identity_dir})") from None


def client_credentials(s: FedSettings, hosted: list[str]) -> auth.Credentials:
    try:
        return auth.Credentials.load(s.identity_dir, hosted)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"credentials of this process's clients ({', '.join(hosted)}): {e}. The operator mounts one per "
            f"client the pod hosts ({C.ENV_IDENTITY_DIR}={s.identity_dir}); one missing means federated.clients "
            "or the gang size changed after the job's credentials were minted: create the job anew"
        ) from None


# ------------------------------------------------------------------ aggregator


def make_evaluator(cfg: TrainerConfig, ds: Dataset):  # noqa: ANN201
    model = build_model(cfg.spec, ds)
    amp = make_amp("fp32", torch.device("cpu"))

    def run_eval(state: dict[str, torch.Tensor]) -> float:
        model.load_state_dict(state)
        return evaluate(model, ds, amp)[1]

    return run_eval


def listen_address(s: FedSettings) -> str:
    host = s.server_addr.rsplit(":", 1)[0]
    # Tests and local runs stay on the loopback; in a pod the Service routes to any address.
    bind = host if host in ("127.0.0.1", "localhost", "[::1]") else "0.0.0.0"
    return f"{bind}:{s.port}"


async def serve(agg: Aggregator, s: FedSettings, *, linger_s: float = DONE_LINGER_S) -> None:
    server = serving.build_server(agg)
    add_port(server, listen_address(s), s.tls)
    await server.start()
    try:
        with stop_request.deferred():
            if await stop_request.run_until_requested(agg.run()):
                print("aggregator: stopped on request; it resumes from its last checkpointed round", flush=True)
                raise stop_request.StopRequested(f"aggregator after round {agg.round}")
            await agg.wait_clients_told(linger_s)
            if serve_until_stopped.requested():
                await serve_until_stopped.wait()
    finally:
        await server.stop(grace=1.0)


def run_aggregator(cfg: TrainerConfig, s: FedSettings) -> dict[str, Any]:
    spec = cfg.spec
    ds = load_dataset(spec)
    model = build_model(spec, ds)
    metrics = FedMetrics(job=cfg.job, process=AGGREGATOR, port=cfg.metrics_port, log_path=cfg.run_dir / AGGREGATOR_LOG,
                         private=s.fed.privacy is not None,
                         tracking=target_for(cfg))  # fmt: skip - the aggregator sees the whole job
    try:
        agg = Aggregator(
            fed=s.fed, model=model.state_dict(), key=aggregator_key(s), metrics=metrics,
            evaluate=make_evaluator(cfg, ds), checkpoint_dir=cfg.checkpoint_dir, writer=Writer.of(cfg),
            client_rows=partition_sizes(cfg, ds),
            # The global model after the last round: the aggregator alone holds it.
            export=lambda state, rounds: write_export(cfg.checkpoint_dir, state, spec=spec, step=rounds),
        )  # fmt: skip
        agg.restore()
        asyncio.run(serve(agg, s))
        summary = agg.final_summary or agg.summary()  # the one the clients were sent
        write_summary(cfg, summary, metrics)
    finally:
        metrics.close()
    return summary


# ------------------------------------------------------------------ clients


def process_indices(cfg: TrainerConfig) -> list[int]:
    if cfg.rank is not None:
        return [cfg.rank]
    return [cfg.node_rank * cfg.nproc_per_node + i for i in range(cfg.nproc_per_node)]


def partitions(cfg: TrainerConfig, ds: Dataset) -> list[np.ndarray]:
    """Every client's rows, client i's at index i: the same split in every process."""
    fed = cfg.spec.federated
    assert fed is not None
    labels = ds.train_y.take(np.arange(ds.num_train)) if ds.train_y is not None else None
    return partition.split(ds.num_train, labels, fed.clients, fed.partition, cfg.spec.data.seed)


def partition_sizes(cfg: TrainerConfig, ds: Dataset) -> dict[str, int]:
    """Client id -> the rows it holds: the most samples it may declare (the aggregator caps at it)."""
    fed = cfg.spec.federated
    assert fed is not None
    return {cid: len(rows) for cid, rows in zip(client_ids(fed.clients), partitions(cfg, ds), strict=True)}


def client_states(cfg: TrainerConfig, ds: Dataset, hosted: list[str]) -> list[ClientState]:
    parts = partitions(cfg, ds)
    out = []
    for cid in hosted:
        rows = parts[int(cid.rsplit("-", 1)[1])]
        x, y = ds.batch(rows)
        out.append(ClientState(cid=cid, x=torch.from_numpy(np.asarray(x)), y=torch.from_numpy(np.asarray(y))))
    return out


def run_clients(cfg: TrainerConfig, s: FedSettings) -> dict[str, Any] | None:
    """Run this process's clients until the aggregator says done; returns the summary it sent."""
    spec = cfg.spec
    ds = load_dataset(spec)
    indices = process_indices(cfg)
    hosted = sorted(c for i in indices for c in hosted_clients(s.fed.clients, i, cfg.world_size))
    states = client_states(cfg, ds, hosted)
    key = client_credentials(s, hosted)
    metrics = FedMetrics(job=cfg.job, process=f"client-rank{indices[0]}", port=cfg.metrics_port,
                         log_path=cfg.run_dir / f"metrics-client{indices[0]}.jsonl")  # fmt: skip
    print(f"federated client process {indices}: hosting {', '.join(hosted) or 'no clients'}", flush=True)

    async def main() -> dict[str, Any] | None:
        channel = aio_channel(s.server_addr, s.tls, s.tls_server_name)
        try:
            runner = ClientRunner(spec=spec, channel=channel, key=key, clients=states,
                                  make_model=lambda: build_model(spec, ds), metrics=metrics,
                                  patience_s=max(300.0, 5.0 * s.fed.round_timeout_seconds))  # fmt: skip
            with stop_request.deferred():
                if await stop_request.run_until_requested(runner.run()):
                    raise stop_request.StopRequested(f"client process {indices}")
            return runner.final_summary
        finally:
            await channel.close()

    try:
        return asyncio.run(main())
    finally:
        metrics.close()
