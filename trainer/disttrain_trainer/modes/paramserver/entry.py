"""`python -m disttrain_trainer` in mode paramserver: a server shard or a worker, by DISTTRAIN_ROLE."""

from __future__ import annotations

import json
import os
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import torch
from disttrain_api import constants as C
from disttrain_api.identities import SERVER_KEY, worker_ids

from ...checkpoints.fence import Writer
from ...data import load_dataset
from ...models import build_model
from ...process import serve_until_stopped, stop_request
from ...process.config import ConfigError, TrainerConfig
from ...process.precision import make_amp
from ...process.threads import THREADS_ENV, threads_per_rank
from ...run_common import SUMMARY_EVAL_KEY, Summary, evaluate, loss_fn_for, write_summary
from ...telemetry.paramserver_series import ServerMetrics, WorkerMetrics
from ...telemetry.sink import time_fractions
from ...tensor_transport import auth, frames
from ...tensor_transport.channel import Tls, add_port, server_options
from ...tensor_transport.gate import Gate
from ...tensor_transport.limits import Limits, paramserver_limits
from ...tracking.tracker import target_for
from ...weights.export import write_export
from . import service
from . import shards as shardmap
from .server import Shard, ShardConfig
from .servicer import Servicer, authorize
from .settings import PSSettings, load, worker_id
from .worker import Worker

DONE_LINGER_S = 10.0  # after the last update: time for every worker to hear "done"
STOP_POLL_S = 0.5  # how often a serving shard looks for a stop request


def main(cfg: TrainerConfig) -> Summary | None:
    """The mode's entry (modes/__init__.py): the role DISTTRAIN_ROLE names."""
    s = load(cfg)
    frames.reuse_freed_memory()  # every pull and push moves the model's bytes through fresh buffers
    if not os.environ.get(THREADS_ENV):
        torch.set_num_threads(threads_per_rank(cfg.world_size + s.shards))  # the pod's CPUs, not the node's
    if s.role == C.ROLE_SERVER:
        return run_server(cfg, s)
    return run_worker(cfg, s)


def check_batch(cfg: TrainerConfig, workers: int) -> int:
    b = cfg.spec.data.batch_size
    if b % workers:
        raise ConfigError(f"data.batchSize {b} must be divisible by the {workers} workers (each pushes b / workers)")
    return b // workers


# ------------------------------------------------------------------ server


def shard_config(cfg: TrainerConfig, s: PSSettings, checkpoint_root: Path | None) -> ShardConfig:
    spec = cfg.spec
    return ShardConfig(
        index=s.index, workers=s.workers, steps=spec.training.steps, max_staleness=s.ps.max_staleness,
        optimizer=spec.optimizer, push_batch=check_batch(cfg, s.workers),
        checkpoint_dir=checkpoint_root / f"server-{s.index}" if checkpoint_root else None,
        checkpoint_interval=spec.checkpoint.interval_steps, keep=spec.checkpoint.keep, writer=Writer.of(cfg),
    )  # fmt: skip


def shard_tensors(model: torch.nn.Module, s: PSSettings) -> list[tuple[str, torch.Tensor]]:
    params = dict(model.named_parameters())
    plan = shardmap.assign({n: p.numel() * p.element_size() for n, p in params.items()}, s.shards)
    return [(n, params[n].detach()) for n in plan[s.index]]


def start_server(shard: Shard, address: str, *, key: bytes, tls: Tls | None = None, limits: Limits | None = None,
                 log=lambda s: print(s, flush=True)) -> tuple[grpc.Server, int]:  # noqa: ANN001 - (str) -> None
    """A started gRPC server for the shard behind the gate (tokens of the job's workers, derived from
    the server `key`), and the port it listens on (address may ask for port 0)."""
    workers = shard.cfg.workers
    limits = limits or paramserver_limits(workers=workers, shard_bytes=shard.nbytes)
    gate = Gate(keyring=auth.Keyring(key, worker_ids(workers)), limits=limits,
                authorize=lambda method, claim: authorize(shard, method, claim), count=shard.metrics.rejected,
                log=log, service=f"paramserver shard {shard.cfg.index}")  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=limits.max_concurrent_rpcs),
                         options=server_options(limits), maximum_concurrent_rpcs=limits.max_concurrent_rpcs)  # fmt: skip
    sv = Servicer(shard, gate)
    server.add_generic_rpc_handlers((service.handler(sv.hello, sv.pull, sv.push),))
    port = add_port(server, address, tls)
    server.start()
    log(f"paramserver shard {shard.cfg.index}: limits: {limits.describe()}")
    return server, port


def read_server_key(s: PSSettings) -> bytes:
    try:
        return auth.read_key(s.identity_dir / SERVER_KEY)
    except (OSError, ValueError) as e:
        raise ConfigError(f"the parameter server's key: {e} ({C.ENV_IDENTITY_DIR}={s.identity_dir})") from None


def worker_credentials(s: PSSettings) -> auth.Credentials:
    me = worker_id(s.index)
    try:
        return auth.Credentials.load(s.identity_dir, [me])
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"the credential of {me}: {e}. The operator mounts each worker pod its own "
            f"({C.ENV_IDENTITY_DIR}={s.identity_dir}); one missing means the gang grew past the size the "
            "job's credentials were minted for: create the job anew"
        ) from None


def run_server(cfg: TrainerConfig, s: PSSettings) -> dict[str, Any]:
    wall0 = time.perf_counter()
    spec = cfg.spec
    ds = load_dataset(spec)
    model = build_model(spec, ds)
    metrics = ServerMetrics(job=cfg.job, shard=s.index, port=cfg.metrics_port,
                            log_path=cfg.run_dir / f"metrics-server{s.index}.jsonl")  # fmt: skip
    try:
        shard = Shard(shard_config(cfg, s, cfg.checkpoint_dir), shard_tensors(model, s), metrics)
        resumed = shard.restore()
        if resumed is not None:
            print(f"paramserver shard {s.index}: resumed from version {resumed}", flush=True)
        server, _ = start_server(shard, s.listen_address(), key=read_server_key(s), tls=s.tls)
        print(f"paramserver shard {s.index}: serving {len(shard.names)} tensors on {s.listen_address()}", flush=True)
        try:
            with stop_request.deferred():
                while not shard.wait_done(STOP_POLL_S):
                    if stop_request.requested():
                        _stop_shard(shard, server)
            shard.save()
            end = time.monotonic() + DONE_LINGER_S
            while not shard.all_told() and time.monotonic() < end:
                time.sleep(0.05)
            if serve_until_stopped.requested():
                serve_until_stopped.block()
        finally:
            server.stop(grace=1.0).wait()
    finally:
        metrics.close()
    summary = {
        "shard": s.index, "version": shard.version, "resumedFromVersion": shard.resumed_from,
        "stats": dict(shard.stats), "wallS": time.perf_counter() - wall0,
    }  # fmt: skip
    write_json(cfg.run_dir / f"server{s.index}-summary.json", summary)
    return summary


def _stop_shard(shard: Shard, server: grpc.Server) -> None:
    """SIGTERM: refuse new calls (those in flight get a second to finish), save the shard's state
    as of now (atomic and fsynced), and leave; the shard resumes from it, workers retry meanwhile."""
    server.stop(grace=1.0).wait()
    shard.save()
    print(f"paramserver shard {shard.cfg.index}: stopped on request at version {shard.version}", flush=True)
    raise stop_request.StopRequested(f"shard {shard.cfg.index} at version {shard.version}")


# ------------------------------------------------------------------ worker


def run_worker(cfg: TrainerConfig, s: PSSettings) -> dict[str, Any] | None:
    wall0 = time.perf_counter()
    spec = cfg.spec
    check_batch(cfg, s.workers)
    ds = load_dataset(spec)
    model = build_model(spec, ds)
    amp = make_amp("fp32", torch.device("cpu"))
    metrics = WorkerMetrics(job=cfg.job, rank=s.index, port=cfg.metrics_port,
                            log_path=cfg.run_dir / C.RANK_METRICS_FILENAME.format(rank=s.index),
                            tracking=target_for(cfg) if s.index == 0 else None)  # fmt: skip - worker 0 is rank 0
    worker = Worker(spec=spec, index=s.index, workers=s.workers, addrs=s.addrs, model=model, ds=ds,
                    loss_fn=loss_fn_for(ds), metrics=metrics, creds=worker_credentials(s), tls=s.tls,
                    tls_server_name=s.tls_server_name)  # fmt: skip
    main = s.index == 0
    try:
        t0 = time.perf_counter()
        with stop_request.deferred():  # SIGTERM: the worker stops after its iteration in flight
            worker.run(evaluate=(lambda m: evaluate(m, ds, amp)[1]) if main else None)
        train_s = time.perf_counter() - t0
        if not main:
            return None
        name, value = evaluate(model, ds, amp)
        metrics.write({"event": "eval", "step": worker.step, "version": worker.version, name: value})
        worker.close()
        summary = summarize(worker, s, eval_name=name, eval_value=value, train_s=train_s,
                            wall_s=time.perf_counter() - wall0)  # fmt: skip
        # The worker's last pull, once every shard was done, is the servers' final parameters (buffers,
        # which no server holds, are this worker's own).
        summary["export"] = write_export(cfg.checkpoint_dir, model.state_dict(), spec=spec, step=worker.step)
        write_summary(cfg, summary, metrics)
    finally:
        worker.close()
        metrics.close()
    return summary


def summarize(worker: Worker, s: PSSettings, *, eval_name: str, eval_value: float, train_s: float,
              wall_s: float) -> dict[str, Any]:  # fmt: skip
    t = worker.totals
    stats = worker.server_stats()
    accepted = stats.get("accepted", 0.0)
    rejected = {k.split(":", 1)[1]: int(v) for k, v in stats.items() if k.startswith("rejected:")}
    staleness = {k.split(":", 1)[1]: int(v) for k, v in stats.items() if k.startswith("staleness:")}
    return {
        "mode": "paramserver",
        "steps": worker.step,
        "workers": s.workers,
        "shards": s.shards,
        "maxStaleness": s.ps.max_staleness,
        SUMMARY_EVAL_KEY.get(eval_name, eval_name): eval_value,
        "finalLoss": worker.last_loss,
        "resumedFromStep": worker.resumed_from,
        "trainS": train_s,
        "wallS": wall_s,
        "samplesPerS": t.samples / t.step_s if t.step_s else 0.0,
        # Communication (pull and push) is all exposed: the worker waits for it.
        **time_fractions(step_s=t.step_s, compute_s=t.compute_s, data_s=t.data_s, exposed_s=t.comm_s,
                         busy_s=t.comm_s, idle_s=t.idle_s),
        "pullSeconds": t.pull_s,
        "pushSeconds": t.push_s,
        "pullBytes": t.pull_bytes,
        "pushBytes": t.push_bytes,
        "pushesAccepted": int(accepted),
        "pushesRejected": sum(rejected.values()),
        "rejectedByReason": rejected,
        "stalenessHistogram": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))),
        "accuracyPerEval": [[step, acc] for step, acc in worker.eval_history],
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
