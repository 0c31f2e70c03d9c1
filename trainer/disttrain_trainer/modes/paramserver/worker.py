"""A Downpour SGD worker: pull what changed, compute a gradient on its own batch, push it; repeat.

A worker never waits for another: it talks only to the server shards, and its
progress (how many iterations it has pushed) is kept by the servers, so a
replaced worker carries on where its predecessor stopped, on the same batches.
Iteration k of worker w trains on the w-th slice of the k-th global batch, as
rank w of a synchronous run would. When the servers are unreachable (a shard
restarting) it retries with backoff; that time counts as idle. On SIGTERM it
finishes the iteration in flight (its push) and stops: its progress is the
servers' count, so there is nothing of its own to save.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import torch
from disttrain_api.model import JobSpec
from torch import nn

from ...data import Dataset, GlobalBatchSampler, next_batch
from ...process import stop_request
from ...process.precision import make_amp
from ...telemetry.paramserver_series import WorkerMetrics, WorkerTally
from ...telemetry.step_metrics import ends_interval
from ...tensor_transport import auth
from ...tensor_transport.channel import Tls
from . import shards as shardmap
from .service import Pulled, ShardClient
from .settings import worker_id

RETRY_ERRORS = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED)  # fmt: skip
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
DONE_POLL_S = 0.2
CALL_TIMEOUT_S = 60.0
# A replaced server comes back by itself (its Deployment, or the local launcher); a worker that
# gave up sooner would only be replaced in turn. runPolicy.activeDeadlineSeconds bounds the job.
PATIENCE_S = 1800.0


class ServerLost(RuntimeError):
    """The servers stayed unreachable longer than the worker's patience."""


@dataclass(kw_only=True)
class ShardView:
    client: ShardClient
    names: list[str]
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # this shard's tensors of the model
    version: int = -1  # none pulled yet
    incarnation: str = ""
    scalars: dict[str, float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The shard said every worker is through: its parameters are final."""
        return self.scalars.get("done", 0.0) >= 1.0


class Worker:
    def __init__(self, *, spec: JobSpec, index: int, workers: int, addrs: tuple[str, ...], model: nn.Module,
                 ds: Dataset, loss_fn: Any, metrics: WorkerMetrics, creds: auth.Credentials, tls: Tls | None = None,
                 tls_server_name: str | None = None, patience_s: float = PATIENCE_S):  # fmt: skip
        self.spec, self.index, self.workers = spec, index, workers
        self.id = worker_id(index)
        self.model, self.ds, self.loss_fn, self.metrics = model, ds, loss_fn, metrics
        self.patience_s = patience_s
        self.params = dict(model.named_parameters())
        sizes = {n: p.numel() * p.element_size() for n, p in self.params.items()}
        plan = shardmap.assign(sizes, len(addrs))
        self.shards = [
            ShardView(client=ShardClient(a, max_bytes=sum(sizes[n] for n in part), creds=creds, tls=tls,
                                         server_name=tls_server_name),
                      names=part, params={n: self.params[n] for n in part})  # fmt: skip
            for a, part in zip(addrs, plan, strict=True)
        ]
        self.sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, index, workers)
        self.steps_per_epoch = ds.num_train // spec.data.batch_size
        self.amp = make_amp("fp32", torch.device("cpu"))
        self.step = 0  # iterations the servers have counted for this worker
        self.resumed_from: int | None = None
        self.totals = WorkerTally()
        self.last_loss = float("nan")
        self.eval_history: list[tuple[int, float]] = []

    # ------------------------------------------------------------------ calls

    def _retrying(self, what: str, call: Any, tally: WorkerTally) -> Any:
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                return call()
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                if code not in RETRY_ERRORS:
                    raise
                if time.monotonic() - start > self.patience_s:
                    raise ServerLost(f"{what}: server unreachable for {self.patience_s:.0f} s ({code})") from e
                if stop_request.requested():  # nothing half-done: the servers count what arrived
                    raise stop_request.StopRequested(f"worker {self.index} while the servers were unreachable") from e
                pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                time.sleep(pause)
                tally.idle_s += pause

    def pull(self, tally: WorkerTally) -> None:
        for s in self.shards:
            if s.done:
                # Final: nothing changes there any more. A shard
                # leaves once it has told every worker, so asking it again could wait for a
                # server that is gone while another shard still has to say "done".
                continue
            t0, idle0 = time.perf_counter(), tally.idle_s
            # The bytes land in the model's own parameters: no copy after the transport's one.
            got: Pulled = self._retrying(
                "pull", lambda s=s: s.client.pull(worker=self.id, version=s.version, incarnation=s.incarnation,
                                                  timeout=CALL_TIMEOUT_S, into=s.params), tally)  # fmt: skip
            s.version, s.incarnation, s.scalars = got.version, got.incarnation, got.scalars
            # Backoff while the shard was unreachable is idle, not communication.
            tally.pull_s += time.perf_counter() - t0 - (tally.idle_s - idle0)
            tally.pull_bytes += got.wire_bytes

    def push(self, loss: float, tally: WorkerTally) -> None:
        for s in self.shards:
            grads = [(n, self.params[n].grad.detach()) for n in s.names if self.params[n].grad is not None]
            t0 = time.perf_counter()
            try:
                r = s.client.push(worker=self.id, version=s.version, incarnation=s.incarnation, grads=grads,
                                  scalars={"loss": loss}, timeout=CALL_TIMEOUT_S)  # fmt: skip
            except grpc.RpcError as e:
                if e.code() not in RETRY_ERRORS:
                    raise
                # Applied or not, the next pull tells: the shard's count of this worker's pushes is the truth.
                tally.push_s += time.perf_counter() - t0
                tally.rejected += 1
                continue
            tally.push_s += time.perf_counter() - t0
            tally.push_bytes += r.wire_bytes
            if not r.accepted:
                tally.rejected += 1

    # ------------------------------------------------------------------ loop

    @property
    def done(self) -> bool:
        return all(s.done for s in self.shards)

    @property
    def version(self) -> int:
        """The parameters' version as last pulled from shard 0: the updates it applied (every worker's)."""
        return max(0, self.shards[0].version)

    def server_steps(self) -> int:
        return int(min(s.scalars.get("workerSteps", 0.0) for s in self.shards))

    def _seek(self, k: int) -> None:
        self.sampler.seek(k // self.steps_per_epoch,
                          (k % self.steps_per_epoch) * self.spec.data.batch_size)

    def run(self, *, evaluate: Any = None) -> None:
        tr = self.spec.training
        interval = WorkerTally()
        first = True
        while True:
            if stop_request.requested():  # between iterations: the last push is through
                self.totals.merge(interval)
                raise stop_request.StopRequested(f"worker {self.index} after iteration {self.step}")
            t0 = time.perf_counter()
            self.pull(interval)
            k = self.server_steps()
            if first:
                self.resumed_from = k or None
                first = False
            if self.done:
                break
            if k >= tr.steps:  # this worker is through; the others are not yet
                time.sleep(DONE_POLL_S)
                interval.idle_s += DONE_POLL_S
                interval.step_s += time.perf_counter() - t0
                continue
            self.step = k
            self._seek(k)
            t1 = time.perf_counter()
            x, y = next_batch(self.ds, self.sampler)
            xt, yt = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y))
            t2 = time.perf_counter()
            self.model.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(xt), yt)
            loss.backward()
            loss_v = float(loss.detach())
            t3 = time.perf_counter()
            self.push(loss_v, interval)
            end = time.perf_counter()
            self.step = k + 1
            self.last_loss = loss_v
            interval.steps += 1
            interval.samples += len(yt)
            interval.loss_sum += loss_v
            interval.data_s += t2 - t1
            interval.compute_s += t3 - t2
            interval.step_s += end - t0
            self.metrics.observe_iteration(end - t0)
            if ends_interval(self.step, log_every=tr.log_interval_steps, steps=tr.steps):
                self.metrics.observe(self.step, interval, version=self.version)
                self.totals.merge(interval)
                interval = WorkerTally()
            if (evaluate is not None and tr.eval_interval_steps and self.step % tr.eval_interval_steps == 0
                    and self.step < tr.steps):  # fmt: skip - the final evaluation follows the last pull
                te = time.perf_counter()
                acc = evaluate(self.model)
                self.eval_history.append((self.step, acc))
                self.metrics.write({"event": "eval", "step": self.step, "version": self.version, "test_accuracy": acc,
                                    "eval_s": time.perf_counter() - te})  # fmt: skip
        self.totals.merge(interval)

    def server_stats(self) -> dict[str, float]:
        """Counters summed over the shards, as the last pull reported them."""
        out: dict[str, float] = {}
        for s in self.shards:
            for k, v in s.scalars.items():
                if k not in ("workerSteps", "done"):
                    out[k] = out.get(k, 0.0) + v
        return out

    def close(self) -> None:
        for s in self.shards:
            s.client.close()
