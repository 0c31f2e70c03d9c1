"""Mode data with spec.faultTolerance: one replica group (this worker pod) trains with the others
through torchft, and goes on at a smaller quorum when one of them fails. A group is one process
(ddp), or procsPerWorker processes that shard the model with FSDP2 (HSDP: parallel/ft_hsdp.py);
each process runs this loop, its group's processes in step with each other.

Per step: a quorum from the job's lighthouse when one is due (ft_quorum.step_quorum_due: every
quorumIntervalSteps committed steps, and after a step that failed; a replica that joins receives
the weights, optimizer state, sampler and step of a live peer here, before its first forward), the
batch, forward and backward with the gradients all-reduced over the quorum at its end
(parallel/ft_ddp.py), then a commit vote:
a step whose all-reduce failed (a peer died mid-step) is not applied, and is trained again with the
same batch at the next quorum, without the dead peer. With training.sync localsgd / diloco the
replicas step alone and the quorum, all-reduce and vote happen once per sync (parallel/sync.py).

Time categories as every mode (telemetry/step_metrics.py): data; communication = the quorum, the
all-reduce at the end of backward and the vote (all exposed: each blocks the step), and in an HSDP
group FSDP's collectives among its processes (busy and exposed as the profiler measures them);
idle = the quorum's wait after a step at which the quorum's rank 0 checkpointed or evaluated alone
(and that rank's own checkpoint or evaluation); compute = the rest. Discarded attempts count with
their time and no samples.

The periodic checkpoint, written by the quorum's rank 0 (ft_checkpoints.py), is the fallback when
the gang restarts (fewer than minReplicas left); every replica starts from it, and is then brought
to the quorum's step by a live peer if the others are ahead.

Inside an HSDP group every decision that leads to a collective of the group (gathering the full
tensors for a checkpoint, evaluating) is the same on all its processes: the quorum and the commit
vote are the group's, and what a process reads from the checkpoint directory is group rank 0's
answer (`_agreed`). A stop request ends a group's processes at their next wait for the quorum
(ft_quorum.for_peers), between the same two steps (one a moment behind the peer that left finds
its collective failed, and stops too: ft_quorum.group_left_on_request); a one-process replica
stops at the top of its next step, the quorum's rank 0 saving it first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from disttrain_api import constants as C
from torch.distributed.device_mesh import init_device_mesh

from ...checkpoints import rank_state
from ...checkpoints import sharded as sharded_ckpt
from ...checkpoints.fence import Writer
from ...collective_rank import collective_rank
from ...data import GlobalBatchSampler, next_batch
from ...optim import build_optimizer, build_scheduler
from ...parallel import ddp, fsdp, ft_hsdp
from ...parallel.comm_profile import ProfiledComm
from ...parallel.ft_ddp import FTComm, FTDataParallel, spread_over_quorum
from ...parallel.sync import ManagerAverager, OuterSync
from ...process import stop_request
from ...process.config import TrainerConfig
from ...process.dist_env import keep_until_exit
from ...run_common import (
    SUMMARY_EVAL_KEY,
    Summary,
    evaluate,
    loss_fn_for,
    mark_finished,
    write_summary,
    write_termination_message,
)
from ...telemetry.model_flops import throughput_fields
from ...telemetry.step_metrics import Metrics, StepRecord, Tally, ends_interval, fold_steps
from ...weights.export import export_on_rank0
from . import ft_checkpoints, ft_quorum, ft_replica
from .ft_state import ReplicaRun, params_digest, quorum_lr_factor
from .ft_telemetry import ReplicaSeries

T = TypeVar("T")
REPLICA_FILE = "replica{replica}.json"  # in the run dir: what each replica ended with (tests, benchmarks)
# How long a starting gang waits for all its replicas before it trains with those there (_gather).
def run(cfg: TrainerConfig) -> Summary | None:
    wall0 = time.perf_counter()
    spec = cfg.spec
    s = ft_replica.settings_for(cfg)
    metrics = Metrics(job=cfg.job, rank=s.index, mode=spec.mode, port=cfg.metrics_port, run_dir=cfg.run_dir,
                      namespace=cfg.namespace, target_steps=spec.training.steps)  # fmt: skip
    try:
        with collective_rank(cfg, metrics) as rank:
            ctx, inner = rank.ctx, rank.model.to(rank.ctx.device)
            rank_state.seed_rank(spec.data.seed, 0, s.index)
            if spec.parallelism.data_strategy == "fsdp":  # HSDP: sharded over this group's processes
                inner = fsdp.shard(inner, init_device_mesh(ctx.device.type, (s.group_size,), mesh_dim_names=("dp",)))
            optimizer = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
            scheduler = build_scheduler(optimizer, spec.optimizer, spec.data.batch_size, spec.training.steps)
            sampler = GlobalBatchSampler(rank.ds.num_train, spec.data.batch_size, spec.data.seed, s.index, s.processes)
            ckpts = ft_checkpoints.ReplicaCheckpoints(cfg.checkpoint_dir, keep=spec.checkpoint.keep,
                                                      world_size=s.processes, writer=Writer.of(cfg),
                                                      metrics=metrics)  # fmt: skip
            r = ReplicaRun(cfg=cfg, replica=s, ctx=ctx, ds=rank.ds, model=inner, inner=inner, optimizer=optimizer,
                           scheduler=scheduler, amp=rank.amp, sampler=sampler, metrics=metrics, ckpts=ckpts)  # fmt: skip
            if spec.training.sync.kind != "every-step":
                r.outer = OuterSync(inner, spec.training.sync, averager=None)  # type: ignore[arg-type]
            keep_until_exit(r)
            saved = _group_checkpoint(r, ft_checkpoints.read_newest(cfg.checkpoint_dir))
            if saved is not None:
                r.restore(saved[1])
                if s.group_rank == 0:
                    print(f"disttrain-trainer: replica {s.replica} starts from checkpoint step {r.step}", flush=True)
            if r.summary is not None and r.step >= spec.training.steps:
                return _finished_already(r)
            ft_replica.wait_for_lighthouse(s.lighthouse, cfg.rendezvous_timeout_s)
            # Heartbeats start here: the others' quorum waits for a replica from now on.
            cuda = ctx.device.type == "cuda"
            pg = ft_replica.replica_process_group(s, cuda=cuda)
            r.backend = pg.getBackendName()
            r.manager = ft_replica.open_manager(cfg, s, pg, state_dict=r.healable, load_state_dict=r.load_healed)
            group = None if cuda else pg  # the gradients' sums go to it directly (FTComm.sum_over_quorum)
            keep_until_exit(r.manager)
            comm: FTComm | None = None
            if r.outer is not None:
                r.outer.averager = ManagerAverager(r.manager)
            elif r.sharded:  # the group's reduce-scatter is FSDP2's; across groups, ft_hsdp's all-reduce
                comm = FTComm(r.manager, group=group, profiled=ProfiledComm())
            else:
                r.model = FTDataParallel(inner, r.manager, layout=r.buckets, bucket_cap_mb=spec.training.bucket_cap_mb,
                                         group=group)  # fmt: skip
                comm = r.model.comm
            remove = stop_request.on_request(ft_quorum.leave_if_waiting)
            try:
                with stop_request.deferred(), ft_quorum.group_left_on_request(s.group_size):
                    summary = _train(r, comm)
                    summary["wallS"] = time.perf_counter() - wall0
                    return _finish(r, summary)
            finally:
                remove()
                r.ckpts.report(wait=True)
                r.manager.shutdown(wait=False)
    finally:
        metrics.close()


def _batch(r: ReplicaRun) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = next_batch(r.ds, r.sampler)
    dev = r.ctx.device
    xt, yt = torch.from_numpy(np.asarray(x)).to(dev), torch.from_numpy(np.asarray(y)).to(dev)
    k = r.cfg.spec.training.grad_accumulation
    return [(xt, yt)] if k == 1 else list(zip(xt.chunk(k), yt.chunk(k), strict=True))


class _CommitGate:
    """The optimizer as ddp.train_step sees it: its step is the quorum's commit vote, then (if the
    step is committed) the real step at the learning rate scaled to the quorum."""

    def __init__(self, r: ReplicaRun, comm: FTComm) -> None:
        self.r, self.comm, self.factor, self.committed = r, comm, 1.0, False

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.r.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.r.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        if self.r.sharded:
            ft_hsdp.allreduce_gradients(self.r.inner, self.comm)
        start = time.perf_counter()
        self.committed = bool(self.r.manager.should_commit())
        self.comm.add_coordination(time.perf_counter() - start)
        self.r.buckets.settle(self.committed)
        if not self.committed:
            return
        for g, lr in zip(self.r.optimizer.param_groups, self.r.scheduler.get_last_lr(), strict=True):
            g["lr"] = lr * self.factor
        self.r.optimizer.step()


class _GatedScheduler:
    def __init__(self, r: ReplicaRun, gate: _CommitGate) -> None:
        self.r, self.gate = r, gate

    def step(self) -> None:
        if self.gate.committed:
            self.r.scheduler.step()


def _train(r: ReplicaRun, comm: FTComm | None) -> Summary:
    cfg, spec = r.cfg, r.cfg.spec
    tr, ck = spec.training, spec.checkpoint
    steps, log_every, eval_every = tr.steps, tr.log_interval_steps, tr.eval_interval_steps
    loss_fn = loss_fn_for(r.ds)
    series = ReplicaSeries(r.metrics)
    gate = _CommitGate(r, comm) if comm is not None else None
    interval, records = Tally(), []
    losses: list[torch.Tensor] = []
    last_loss: torch.Tensor | None = None
    eval_result: tuple[str, float] | None = None
    alone_before = False  # the quorum's rank 0 checkpointed or evaluated after the previous step
    pace = float(os.environ.get(C.ENV_FAULT_STEP_SLEEP) or 0.0)  # tests only (constants.py)
    start = time.perf_counter()
    quorum_taken = False  # the first step trains in gather's quorum (when: see ft_quorum.gather)
    if r.outer is None:  # (LocalSGD / DiLoCo: the first sync below; a replica late for it joins at the next)
        quorum_taken = ft_quorum.gather(r, series)
    committed_batches0 = r.manager.batches_committed()
    if r.outer is not None:
        ft_quorum.sync(r, series)  # the first quorum: a replica that joins a running job recovers here
    alone = r.replica.group_size == 1
    while r.step < steps:
        if alone and stop_request.requested():  # (an HSDP group's processes leave at the quorum)
            _stop(r)
        t0 = time.perf_counter()
        quorum_s = 0.0
        if gate is not None:
            if quorum_taken or ft_quorum.step_quorum_due(r.manager, every=r.replica.quorum_interval,
                                                         last_committed=gate.committed, after_alone=alone_before):  # fmt: skip
                if not quorum_taken:
                    _, quorum_s = ft_quorum.step_quorum(r, series)
                quorum_taken = False
                # (the quorum's size changes only here; the first step trains in gather's quorum or asks:
                # its gate has not committed)
                gate.factor = quorum_lr_factor(spec.optimizer.scale_lr, r.manager.num_participants(),
                                               r.replica.replicas)  # fmt: skip
        before = r.sampler.state_dict()
        td = time.perf_counter()
        micro = _batch(r)
        data_s = time.perf_counter() - td
        optimizer = gate if gate is not None else r.optimizer
        scheduler = _GatedScheduler(r, gate) if gate is not None else r.scheduler
        with comm.step() if comm is not None else contextlib.nullcontext():
            res = ddp.train_step(r.model, micro, loss_fn=loss_fn, optimizer=optimizer,  # type: ignore[arg-type]
                                 scheduler=scheduler, amp=r.amp)  # type: ignore[arg-type]  # fmt: skip
        if gate is not None and not gate.committed:
            r.sampler.load_state_dict(before)  # the same rows again, at the next quorum
            r.discarded += 1
            series.discarded()
            c = comm.take() if comm is not None else None
            end = time.perf_counter()
            records.append((t0, t0 + data_s, end, end, c.exposed_s if c else 0.0, c.busy_s if c else 0.0, 0.0, 0, True))
            continue
        r.step += 1
        step = r.step
        c = comm.take() if comm is not None else None
        exposed = c.exposed_s if c is not None else 0.0
        idle = 0.0
        if alone_before:  # the quorum waited for rank 0's checkpoint or evaluation: idle, not communication
            idle, exposed = quorum_s, max(0.0, exposed - quorum_s)
        if r.outer is not None and r.outer.due(step):
            exposed += ft_quorum.sync(r, series)
        last_loss = res.loss
        losses.append(res.loss)
        ti = time.perf_counter()
        evaluate_now = bool(eval_every) and step % eval_every == 0 and step < steps
        checkpoint_now = step % ck.interval_steps == 0 and step < steps
        alone_before = evaluate_now or checkpoint_now
        if _rank0(r) and alone_before:
            if evaluate_now:
                eval_result = evaluate(r.inner, r.ds, r.amp)
                r.metrics.observe_eval(step, *eval_result)
            if checkpoint_now:
                _save(r)
        end = time.perf_counter()
        idle += end - ti
        # data + work + idle = the step's wall time (the quorum's idle part lies inside the work span).
        records.append((t0, t0 + data_s, end - idle, end, exposed, exposed, idle, res.samples, True))
        if ends_interval(step, log_every=log_every, steps=steps):
            _log(r, records, interval, losses, series)
            interval, losses = Tally(), []
        if pace:
            time.sleep(pace)
    if r.outer is not None and not r.outer.due(r.step):
        ft_quorum.sync(r, series)  # the replicas end on one model
    train_s = time.perf_counter() - start
    if records:
        _log(r, records, interval, losses, series)
    t = r.totals
    job_samples = (r.manager.batches_committed() - committed_batches0) * (spec.data.batch_size // r.replica.processes)
    summary: dict[str, Any] = {
        "steps": r.step,
        "finalLoss": float(last_loss) if last_loss is not None else float("nan"),
        "resumedFromStep": r.resumed_from,
        "restartAttempt": cfg.restart_attempt,
        "worldSize": r.replica.processes,
        "mode": spec.mode,
        "layout": f"dp={r.replica.processes},pp=1,tp=1",
        "dataStrategy": spec.parallelism.data_strategy,
        "device": r.ctx.device.type,
        "backend": r.backend,
        "precision": tr.precision,
        "sync": tr.sync.kind,
        "trainS": train_s,
        "samplesPerS": job_samples / train_s if train_s > 0 else 0.0,
        **t.fractions(),
        "faultTolerance": {"replica": r.replica.replica, "quorum": _participants(r), "discardedSteps": r.discarded,
                           "recoveries": r.recoveries, "minReplicas": r.replica.min_replicas,
                           "processesPerReplica": r.replica.group_size},  # fmt: skip
    }
    if r.outer is not None:
        summary["syncs"] = r.outer.syncs
        summary["syncBytes"] = r.outer.syncs * r.outer.bytes_per_sync
    summary.update(throughput_fields(spec, vocab=r.ds.num_classes, samples_per_s=summary["samplesPerS"],
                                     device=r.ctx.device, accelerators=r.replica.processes))  # fmt: skip
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    return summary


def _participants(r: ReplicaRun) -> int:
    return int(r.manager.num_participants()) if r.manager is not None else 0


def _rank0(r: ReplicaRun) -> bool:
    """Whether this replica is rank 0 of the latest quorum (it checkpoints and evaluates; every
    process of its group, together)."""
    return r.manager.participating_rank() == 0


def _agreed(r: ReplicaRun, value: T) -> T:
    """Group rank 0's `value` on every process of the group (what it read from the checkpoint
    directory, which a concurrent write may change between two processes' reads)."""
    if r.replica.group_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _group_checkpoint(r: ReplicaRun, saved: tuple[int, dict[str, Any]] | None) -> tuple[int, dict[str, Any]] | None:
    """The checkpoint group rank 0 found, on every process of the group: loading one into sharded
    weights is a collective."""
    step = _agreed(r, saved[0] if saved is not None else None)
    if step is None:
        return None
    return saved if saved is not None and saved[0] == step else (step, ft_checkpoints.read_step(r.cfg.checkpoint_dir, step))


def _save(r: ReplicaRun) -> None:
    """Checkpoint this step: gathered in the group (collective when sharded), written by group rank 0."""
    state = r.checkpoint_state()
    if r.replica.group_rank == 0:
        r.ckpts.save(state, r.step)


def _log(r: ReplicaRun, records: list[StepRecord], interval: Tally, losses: list[torch.Tensor],
         series: ReplicaSeries) -> None:  # fmt: skip
    fold_steps(records, interval, r.metrics)
    loss = float(torch.stack(losses).mean()) if losses else float("nan")
    lr = r.optimizer.param_groups[0]["lr"]
    grad_bytes = 0 if r.outer is not None else ddp.gradient_bytes(r.inner)
    r.metrics.observe_interval(step=r.step, loss=loss, lr=lr, tally=interval, gradient_bytes=grad_bytes,
                               extra={"quorum": _participants(r), "discarded": r.discarded})  # fmt: skip
    r.totals.merge(interval)
    r.ckpts.report()
    if _rank0(r) and r.replica.group_rank == 0:
        rec = interval.record()
        print(f"step {r.step}/{r.cfg.spec.training.steps} loss {loss:.4f} lr {lr:.4g} quorum {_participants(r)}/"
              f"{r.replica.replicas} samples/s {rec['samples_per_s'] * _participants(r):.0f} "
              f"comm exposed {rec['comm_exposed_fraction']:.0%}", flush=True)  # fmt: skip


def _stop(r: ReplicaRun) -> None:
    """SIGTERM to a one-process replica (an HSDP group's processes leave at the quorum instead):
    leave at this step boundary; the quorum's rank 0 saves the step first (the others go on
    without this replica, or stop too: a gang stopped as a whole resumes from that checkpoint)."""
    if _rank0(r) and r.step > 0 and not r.ckpts.has(r.step):
        _save(r)
    r.ckpts.report(wait=True)
    raise stop_request.StopRequested(f"replica {r.replica.replica} after step {r.step}")


def _finish(r: ReplicaRun, summary: Summary) -> Summary:
    """The last step is committed: rank 0 of the quorum evaluates, writes the final checkpoint (with the
    summary: a replica that restarts later finds the run finished) and summary.json; every replica
    records its parameters' digest. A last quorum lets every replica leave after rank 0 wrote, and its
    all-reduce measures how far the replicas' parameters differ (0 when they are identical)."""
    cfg = r.cfg
    rank0 = _rank0(r)
    lead = r.replica.group_rank == 0  # writes for its group
    if rank0:
        name, value = evaluate(r.inner, r.ds, r.amp)
        summary[SUMMARY_EVAL_KEY[name]] = value
        if lead:
            r.ckpts.claim()
        state_of = (lambda: sharded_ckpt.full_model_state(r.inner)) if r.sharded else r.inner.state_dict
        summary["export"] = export_on_rank0(state_of, checkpoint_dir=cfg.checkpoint_dir, spec=cfg.spec, step=r.step,
                                            is_main=lead)  # fmt: skip
        r.summary = summary
        _save(r)
        r.ckpts.report(wait=True)
    summary["replicaMaxAbsDiff"] = _divergence(r)
    if not rank0 and _rank0(r) and not _agreed(r, r.ckpts.has(r.step)):  # the writer was lost before it wrote
        r.summary = summary
        _save(r)
        r.ckpts.report(wait=True)
    digest = _group_digest(r)
    summary["faultTolerance"]["paramsSha256"] = digest
    if lead:
        if _rank0(r):
            write_summary(cfg, summary)
        elif cfg.termination_log is not None:
            write_termination_message(cfg.termination_log, summary)
        (cfg.run_dir / REPLICA_FILE.format(replica=r.replica.replica)).write_text(json.dumps(
            {"step": r.step, "paramsSha256": digest, "discardedSteps": r.discarded, "recoveries": r.recoveries,
             "restartAttempt": cfg.restart_attempt, "replicaMaxAbsDiff": summary["replicaMaxAbsDiff"]}))  # fmt: skip
    mark_finished(cfg, r.replica.index, r.step)
    return summary


def _group_digest(r: ReplicaRun) -> str:
    """params_digest of the whole replica: of its one process, or of its group's shard digests in
    group rank order (replicas that hold identical weights agree)."""
    digest = params_digest(r.inner)
    if r.replica.group_size == 1:
        return digest
    digests: list[str | None] = [None] * r.replica.group_size
    dist.all_gather_object(digests, digest)
    return hashlib.sha256("".join(str(d) for d in digests).encode()).hexdigest()


def _divergence(r: ReplicaRun) -> float | None:
    """max |p_i - p_j| over the last quorum's replicas (one quorum, one all-reduce)."""
    flat = torch.cat([p.float().reshape(-1) for p in ft_hsdp.local_params(r.inner)])
    try:
        r.manager.start_quorum()
        spread = spread_over_quorum(r.manager, flat)
        if not r.manager.should_commit():
            return None
    except Exception as e:  # noqa: BLE001 - the figure is a check, the run itself is complete
        print(f"disttrain-trainer: replica {r.replica.replica}: no last quorum ({e}); divergence not measured",
              flush=True)  # fmt: skip
        return None
    return float(spread.max())


def _finished_already(r: ReplicaRun) -> Summary:
    """The newest checkpoint is the run's last: nothing to train, its figures stand."""
    assert r.summary is not None
    if r.replica.group_rank == 0:
        if r.cfg.termination_log is not None:
            write_termination_message(r.cfg.termination_log, r.summary)
        if not (r.cfg.run_dir / "summary.json").exists():
            write_summary(r.cfg, r.summary)
    mark_finished(r.cfg, r.replica.index, r.step)
    return r.summary
