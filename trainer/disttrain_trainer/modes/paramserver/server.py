"""One parameter-server shard: its tensors, their optimizer state and version; applies pushes as they arrive.

Staleness = the shard's version now - the version the gradient was computed on.
A push with staleness > maxStaleness is *rejected*, not held back: holding it (or
making the fast worker wait, as stale-synchronous parallel does) would make a
fast worker wait for a slow one, which this mode promises never happens; the
rejected worker simply pulls the fresh parameters and carries on with its next
batch. Within the bound the step is taken with lr / max(1, staleness) (Zhang et
al. 2016, staleness-aware async SGD), so one worker with staleness 0 takes
exactly the steps synchronous SGD takes.

The gRPC side (servicer.py) admits every call through the gate first: a token
made with the calling worker's own credential, bound to this shard's incarnation
and its push count. Every check on a push (known tensor names, dtype, shape, finite values) runs
before the lock is taken and before anything is written, so a rejected push
leaves parameters, optimizer state and version untouched. Checkpoints hold
parameters + optimizer state + version + per-worker progress, written
atomically by `checkpoint.save`; a restarted shard resumes from the newest one
under a new incarnation id, so workers that hold parameters of the lost future
pull everything again instead of trusting a version number.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from disttrain_api.model import OptimizerSpec

from ...checkpoints import directory as cdir
from ...checkpoints import whole as ckpt
from ...checkpoints.fence import Fenced, Writer, exit_fenced
from ...optim import build_optimizer, lr_at
from ...telemetry.paramserver_series import ServerMetrics
from ...tensor_transport import auth, codec
from ...tensor_transport.protos import tensor_transport_pb2 as pb
from . import service
from .settings import worker_id


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    index: int
    workers: int  # worker ids are worker-0 .. worker-(workers-1)
    steps: int  # iterations each worker runs
    max_staleness: int
    optimizer: OptimizerSpec
    push_batch: int  # samples behind one pushed gradient (the lr rule's batch size)
    checkpoint_dir: Path | None
    checkpoint_interval: int  # versions between checkpoints
    keep: int
    writer: Writer = field(default_factory=Writer)  # who writes its checkpoints (checkpoints/fence.py)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    accepted: bool
    reason: str  # "" when accepted; a counter label otherwise
    message: str
    staleness: int | None = None


class Shard:
    def __init__(self, cfg: ShardConfig, params: Sequence[tuple[str, torch.Tensor]], metrics: ServerMetrics):
        self.cfg = cfg
        self.metrics = metrics
        self.names = [n for n, _ in params]
        self.params = {n: torch.nn.Parameter(t.detach().clone().float(), requires_grad=True) for n, t in params}
        self.optimizer = build_optimizer(list(self.params.values()), cfg.optimizer, cfg.push_batch)
        self.version = 0
        self.modified = dict.fromkeys(self.names, 0)  # version at which each tensor last changed
        self.worker_steps = {worker_id(i): 0 for i in range(cfg.workers)}
        self.told_done: set[str] = set()
        self.stats: Tally[str] = Tally()  # accepted, rejected:<reason>, staleness:<s>
        self.incarnation = uuid.uuid4().hex[:12]
        self.resumed_from: int | None = None
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params.values())
        self._lock = threading.Lock()
        self._readers = 0  # pulls streaming the parameters' current storage
        self._generation = 0  # bumps when an update moves the parameters to fresh storage
        # Gradient buffers reused across pushes: decoding into memory already touched avoids
        # faulting in fresh pages for every push (a large part of a push's cost otherwise).
        self._buffers: list[dict[str, torch.Tensor]] = []
        self._buffers_lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._done = threading.Event()
        self.metrics.version.set(0)

    # ------------------------------------------------------------------ state

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _check_done(self) -> None:
        if all(s >= self.cfg.steps for s in self.worker_steps.values()):
            self._done.set()

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "version": self.version,
                "params": {n: p.detach().clone() for n, p in self.params.items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "worker_steps": dict(self.worker_steps),
                "stats": dict(self.stats),
                "shard": self.cfg.index,
                "names": list(self.names),
            }

    def restore(self) -> int | None:
        """Resume from the newest checkpoint of this shard, if any; returns its version."""
        root = self.cfg.checkpoint_dir
        if root is None:
            return None
        # A shard replaced while it still ran (a lost node) must not publish or prune any more.
        cdir.take_over(root, self.cfg.writer)
        loaded = ckpt.load_latest(root)
        if loaded is None:
            return None
        _, state = loaded
        if list(state["names"]) != self.names:
            raise ValueError(
                f"checkpoint under {root} holds tensors {state['names']}, shard {self.cfg.index} holds "
                f"{self.names}: the model or paramServer.shards changed (start with a fresh checkpoint dir)"
            )
        with self._lock:
            for n, t in state["params"].items():
                self.params[n].data.copy_(t)
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])
            self.modified = dict.fromkeys(self.names, self.version)
            self.worker_steps.update({k: int(v) for k, v in state["worker_steps"].items()})
            self.stats = Tally(state["stats"])
            self.resumed_from = self.version
            self._check_done()
        self.metrics.version.set(self.version)
        return self.version

    def save(self) -> None:
        root = self.cfg.checkpoint_dir
        if root is None:
            return
        with self._save_lock:  # one writer at a time: saves of two versions must not prune each other
            state = self.state()
            try:
                res = ckpt.save(root, state, state["version"], keep=self.cfg.keep, world_size=1)
            except Fenced as e:  # a replaced shard: stop serving at once, from whichever thread saves
                exit_fenced(e)
        self.metrics.checkpoint(state["version"], res.seconds, res.bytes)

    # ------------------------------------------------------------------ push

    def check(self, worker: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> Verdict | None:
        """A Verdict when the push is malformed; None when it may be applied. Reads nothing mutable."""
        if worker not in self.worker_steps:
            return Verdict(accepted=False, reason="unknown_worker",
                           message=f"worker {worker!r} is not one of the job's {self.cfg.workers} workers")  # fmt: skip
        if not tensors:
            return Verdict(accepted=False, reason="empty", message="the push carries no tensor")
        seen: set[str] = set()
        for name, g in tensors:
            p = self.params.get(name)
            if p is None:
                return Verdict(accepted=False, reason="unknown_tensor",
                               message=f"tensor {name!r} is not held by shard {self.cfg.index}")  # fmt: skip
            if name in seen:
                return Verdict(accepted=False, reason="duplicate_tensor", message=f"tensor {name!r} sent twice")
            seen.add(name)
            if g.dtype != p.dtype:
                return Verdict(accepted=False, reason="bad_dtype",
                               message=f"{name}: dtype {g.dtype} where the parameter is {p.dtype}")  # fmt: skip
            if tuple(g.shape) != tuple(p.shape):
                return Verdict(accepted=False, reason="bad_shape",
                               message=f"{name}: shape {tuple(g.shape)} where the parameter is {tuple(p.shape)}")  # fmt: skip
            if not all_finite(g):
                return Verdict(accepted=False, reason="non_finite", message=f"{name}: NaN or Inf in the gradient")
        return None

    def push(self, *, worker: str, version: int, incarnation: str, tensors: Sequence[tuple[str, torch.Tensor]],
             sequence: int | None = None) -> Verdict:  # fmt: skip
        """`sequence`: the worker's push count its token was bound to (the gRPC path); it must
        still be the count when the push is applied, so a replay racing the original loses."""
        bad = self.check(worker, tensors)
        if bad is not None:
            return self.reject(bad)
        with self._lock:
            verdict = self._apply(worker, version, incarnation, tensors, sequence)
            version_now = self.version
        if not verdict.accepted:
            self.metrics.rejected(verdict.reason)
            return verdict
        if version_now % self.cfg.checkpoint_interval == 0:
            self.save()
        return verdict

    def _apply(self, worker: str, version: int, incarnation: str, tensors: Sequence[tuple[str, torch.Tensor]],
               sequence: int | None) -> Verdict:  # fmt: skip
        """The staleness check and the optimizer step; the caller holds the lock."""
        if sequence is not None and sequence != self.worker_steps[worker]:
            self.stats[f"rejected:{auth.EXPIRED_ROUND}"] += 1
            return Verdict(accepted=False, reason=auth.EXPIRED_ROUND,
                           message=f"the token is bound to push {sequence} of {worker}, the shard has counted "
                           f"{self.worker_steps[worker]}")  # fmt: skip
        if incarnation != self.incarnation:
            self.stats["rejected:incarnation"] += 1
            return Verdict(accepted=False, reason="incarnation",
                           message=f"computed on parameters of server incarnation {incarnation or '(none)'}, "
                           f"this is {self.incarnation} (the server restarted): pull again")  # fmt: skip
        self.worker_steps[worker] += 1
        staleness = self.version - version
        self.stats[f"staleness:{max(staleness, 0)}"] += 1
        self.metrics.staleness.observe(max(staleness, 0))
        if staleness < 0 or staleness > self.cfg.max_staleness:
            self.stats["rejected:stale"] += 1
            self._check_done()
            return Verdict(accepted=False, reason="stale", staleness=staleness,
                           message=f"computed on version {version}, the shard is at {self.version}: staleness "
                           f"{staleness} exceeds maxStaleness {self.cfg.max_staleness}")  # fmt: skip
        t0 = time.perf_counter()
        if self._readers:  # pulls still stream the current storage: leave it to them, write anew
            for p in self.params.values():
                p.data = p.data.clone()
            self._generation += 1
            self._readers = 0
        lr = self.lr_for(self.version) / max(1, staleness)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for p in self.params.values():
            p.grad = None
        for name, g in tensors:
            self.params[name].grad = g
        self.optimizer.step()
        self.version += 1
        for name, _ in tensors:
            self.modified[name] = self.version
        for p in self.params.values():
            p.grad = None
        self.stats["accepted"] += 1
        self.metrics.accepted(staleness=staleness, apply_s=time.perf_counter() - t0, version=self.version)
        self._check_done()
        return Verdict(accepted=True, reason="", message="", staleness=staleness)

    def lr_for(self, version: int) -> float:
        # The schedule runs in synchronous-equivalent steps: `workers` updates make one step.
        return lr_at(version // self.cfg.workers, opt=self.cfg.optimizer, batch_size=self.cfg.push_batch,
                     total_steps=self.cfg.steps)  # fmt: skip

    def reject(self, v: Verdict) -> Verdict:
        with self._lock:
            self.stats[f"rejected:{v.reason}"] += 1
        self.metrics.rejected(v.reason)
        return v

    # ------------------------------------------------------------------ pull

    def snapshot(self, *, worker: str, version: int, incarnation: str) -> tuple[pb.StreamHeader, list[tuple[str, torch.Tensor]], int]:
        """The header and the tensors changed since `version` (all of them for another incarnation
        or a future version), as views of the live parameters, and the generation to `release`.

        No copy is made here and no lock is held while they stream (so the copy into frames
        overlaps sending): until released, the next update writes into fresh storage instead
        (copy-on-write in `_apply`), so a reader always sees exactly one version."""
        with self._lock:
            full = incarnation != self.incarnation or version > self.version
            tensors = [(n, self.params[n].detach()) for n in self.names if full or self.modified[n] > version]
            done = self.done
            if done and worker in self.worker_steps:
                self.told_done.add(worker)
            scalars = {"workerSteps": float(self.worker_steps.get(worker, 0)), "done": float(done),
                       **{k: float(v) for k, v in self.stats.items()}}  # fmt: skip
            header = codec.make_header(kind=service.KIND_PARAMS, round=self.version, tensors=tensors,
                                       scalars=scalars, attrs={service.ATTR_INCARNATION: self.incarnation})  # fmt: skip
            self._readers += 1
            return header, tensors, self._generation

    def release(self, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._readers -= 1

    def take_buffer(self) -> dict[str, torch.Tensor]:
        with self._buffers_lock:
            if self._buffers:
                return self._buffers.pop()
        return {n: torch.empty_like(p, memory_format=torch.contiguous_format) for n, p in self.params.items()}

    def give_buffer(self, buf: dict[str, torch.Tensor]) -> None:
        with self._buffers_lock:
            self._buffers.append(buf)

    def all_told(self) -> bool:
        with self._lock:
            return self.told_done >= set(self.worker_steps)


def all_finite(t: torch.Tensor) -> bool:
    """Exact, and cheap when the answer is yes: a NaN or Inf makes the sum non-finite, so one
    reduction without a temporary clears a good tensor; only a non-finite sum (which an overflow
    of huge finite values can also give) pays for the element-wise test."""
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())
