"""The training loop of `mode: pipeline` and of `mode: hybrid` with pipeline > 1.

Ranks form the job's (data, pipeline, tensor) DeviceMesh (parallel/mesh.py):
rank = (replica x pipeline + stage) x tensor + tensor index, so a stage's
tensor-parallel ranks are consecutive (one pod) and one pipeline's stages are
the next groups. Each rank holds its stages' blocks (parallel/pipeline.py or,
for PipeDream, parallel/pipedream.py), with tensor > 1 sharded over mesh["tp"]
by the blocks' tensor-parallel plans (parallel/tensor.py); the ranks of one
tensor index form a pipeline over mesh["pp"]. With more than one replica, stage
i's gradients (this rank's shards) are averaged with the other replicas' stage i
over mesh["dp"].

Per step and rank the loop reports the categories every mode reports, measured:
  data    = fetching the replica's batch;
  compute = this rank's forward/backward computations plus the optimizer;
  comm    = P2P waits (inputs in flight, see pipeline_stats.py) plus the data-parallel all-reduce;
  idle    = the rest of the step: the pipeline bubble (waiting for another stage's work), the
            schedule's own bookkeeping and waiting while rank 0 evaluates or checkpoints;
(into `Metrics`' Tally as t2 = t1 + compute + comm, comm exposed = busy, idle = end - t2)
and, per stage, the bubble of the pipeline window, its fraction and the peak of
activation memory held. Checkpoints hold every stage's blocks (keyed by global
block index, full tensors whatever the tensor degree), each stage's optimizer
(keyed by parameter name, full tensors), the plan and the RNG streams of every rank:
rank 0 writes them atomically after gathering the parts. The final checkpoint
also carries the summary: a finished run resumed returns it without training.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from . import checkpoint as ckpt
from . import resume, scaling_record
from .config import ConfigError, TrainerConfig
from .data import Dataset, GlobalBatchSampler
from .dist_env import DistContext
from .loop_gc import LoopGC
from .metrics import Metrics, Tally, ends_interval
from .model_flops import throughput_fields
from .optim import build_optimizer, build_scheduler
from .parallel.blocks import block_state, load_block_state, split_blocks
from .parallel.mesh import build_mesh, layout_for
from .parallel.partition import Plan
from .parallel.pipedream import PipeDreamStage
from .parallel.pipeline import Pipeline, StepOut, total_stages
from .parallel.pipeline_metrics import PipelineMetrics
from .parallel.pipeline_plan import choose_plan
from .parallel.pipeline_stats import split_idle
from .parallel.tensor import stage_sharder
from .precision import Amp
from .train import SUMMARY_EVAL_KEY, evaluate, loss_fn_for


def check_pipeline_supported(cfg: TrainerConfig) -> None:
    spec = cfg.spec
    if spec.parallelism.schedule == "PipeDream" and spec.parallelism.tensor != 1:
        raise ConfigError(f"schedule PipeDream runs with parallelism.tensor 1 (got {spec.parallelism.tensor}); "
                          "use a synchronous schedule with tensor parallelism")  # fmt: skip
    layout_for(spec, cfg.world_size)  # the degrees fit this world size
    if spec.parallelism.data_strategy != "ddp":
        raise ConfigError("parallelism.dataStrategy fsdp is not supported with a pipeline; use ddp")
    if spec.training.grad_accumulation != 1:
        raise ConfigError("training.gradAccumulation must be 1 with a pipeline: use parallelism.microbatches")
    if spec.training.precision != "fp32":
        raise ConfigError(f"training.precision {spec.training.precision}: pipeline modes run fp32 only")
    if spec.parallelism.schedule == "PipeDream" and spec.data_degree > 1:
        raise ConfigError("schedule PipeDream runs one pipeline (data degree 1); use a synchronous schedule")


@dataclass(kw_only=True)
class PipeRun:
    cfg: TrainerConfig
    ctx: DistContext
    ds: Dataset
    full: nn.Module  # the whole model: rank 0 evaluates it after gathering every stage's blocks
    full_blocks: list[nn.Module]  # its blocks: plain tensors, also with tensor > 1
    blocks: list[nn.Module]
    stage_root: nn.Module  # this rank's stage modules: names the optimizer state's parameters
    plan: Plan
    engine: Pipeline | PipeDreamStage
    block_ids: list[int]
    dp_rank: int
    dp_size: int
    pp_rank: int
    tp_rank: int
    dp_group: dist.ProcessGroup
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: GlobalBatchSampler
    metrics: Metrics
    pmetrics: PipelineMetrics
    step: int = 0
    resumed_from: int | None = None
    summary: dict[str, Any] | None = None  # set once training is over; the final checkpoint carries it
    totals: Tally = field(default_factory=Tally)
    bubble: dict[str, float] = field(default_factory=lambda: {"bubble": 0.0, "window": 0.0})
    peak_bytes: int = 0
    scaling: scaling_record.ScalingRecorder = field(default_factory=scaling_record.ScalingRecorder)

    # ------------------------------------------------------------ checkpoints

    def _gather(self, part: dict[str, Any]) -> list[dict[str, Any]] | None:
        parts: list[dict[str, Any]] | None = [{} for _ in range(self.ctx.world_size)] if self.ctx.is_main else None
        dist.gather_object(part, parts, dst=0)
        return parts

    def _stage_part(self) -> dict[str, Any]:
        """Replica 0's full blocks of this stage, from its tensor index 0 (the others take part in
        gathering the shards, then send nothing)."""
        if self.dp_rank != 0:
            return {}
        blocks = _cpu(block_state(self.blocks, self.block_ids))
        return {"blocks": blocks} if self.tp_rank == 0 else {}

    def gather_blocks(self) -> dict[str, torch.Tensor] | None:
        parts = self._gather(self._stage_part())
        if parts is None:
            return None
        return {k: v for p in parts for k, v in p.get("blocks", {}).items()}

    def save_checkpoint(self) -> None:
        part = {"rng": resume.rng_state(), **self._stage_part()}
        if self.dp_rank == 0:
            optim = get_optimizer_state_dict(self.stage_root, self.optimizer, options=FULL)
            if self.tp_rank == 0:
                part |= {"pp_rank": self.pp_rank, "optimizer": optim}
        parts = self._gather(part)
        info = [0.0, 0]
        if parts is not None:
            state = {
                "step": self.step, "world_size": self.ctx.world_size, "plan": self.plan.to_json(),
                "blocks": {k: v for p in parts for k, v in p.get("blocks", {}).items()},
                "optimizers": {p["pp_rank"]: p["optimizer"] for p in parts if "optimizer" in p},
                "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": [p["rng"] for p in parts], "summary": self.summary,
            }  # fmt: skip
            res = ckpt.save(self.cfg.checkpoint_dir, state, self.step, keep=self.cfg.spec.checkpoint.keep,
                            world_size=self.ctx.world_size)  # fmt: skip
            info = [res.seconds, res.bytes]
        dist.broadcast_object_list(info, src=0)  # also a barrier: nobody runs ahead of a half-written save
        self.metrics.observe_checkpoint(self.step, float(info[0]), int(info[1]))

    def restore(self, state: dict[str, Any]) -> None:
        load_block_state(self.blocks, range(len(self.blocks)), state["blocks"])
        set_optimizer_state_dict(self.stage_root, self.optimizer, state["optimizers"][self.pp_rank], options=FULL)
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = self.resumed_from = int(state["step"])
        self.summary = state.get("summary")
        rngs = state["rng"]
        if len(rngs) == self.ctx.world_size:  # same gang shape: each rank continues its own streams
            resume.set_rng_state(rngs[self.ctx.rank])
        else:  # resharded: no saved stream belongs to this rank
            resume.seed_rank(self.cfg.spec.data.seed, self.step, self.rng_stream)

    @property
    def rng_stream(self) -> int:
        """One stream per tensor-parallel group: its replicated activations see the same dropout masks."""
        return self.ctx.rank // self.cfg.spec.parallelism.tensor


# Optimizer state with full tensors keyed by parameter name: gathered from the tensor-parallel
# shards when saved (collective over mesh["tp"]), this rank's shards cut again when loaded.
FULL = StateDictOptions(full_state_dict=True)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _cpu(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in d.items()}


def setup(cfg: TrainerConfig, ctx: DistContext, ds: Dataset, model: nn.Module, metrics: Metrics) -> PipeRun:
    spec = cfg.spec
    par = spec.parallelism
    layout = layout_for(spec, ctx.world_size)
    pp, dp, tp = layout.pp, layout.dp, layout.tp
    mesh = build_mesh(layout, ctx.device.type)
    dp_rank, pp_rank, tp_rank = (mesh[d].get_local_rank() for d in ("dp", "pp", "tp"))
    # Rank 0 evaluates a plain copy: the tensor-parallel blocks need their whole group in every forward.
    full = copy.deepcopy(model) if tp > 1 and ctx.is_main else model
    blocks = split_blocks(model, name=spec.model.name)
    n_stages = total_stages(par.schedule, pp, par.virtual_stages)
    if len(blocks) < n_stages:
        raise ConfigError(f"model {spec.model.name} has {len(blocks)} blocks, fewer than the {n_stages} stages of "
                          f"parallelism.pipeline {pp} x virtualStages; use more layers or fewer stages")  # fmt: skip
    loaded = resume.agree_on_checkpoint(cfg.checkpoint_dir, ctx)
    saved_plan = Plan.from_json(loaded[1]["plan"]) if loaded else None
    sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, dp_rank, dp)
    mb = spec.data.batch_size // dp // par.microbatches
    sample_rows = np.arange(mb)
    x, _ = ds.batch(sample_rows)
    plan, profiles = choose_plan(blocks, torch.from_numpy(np.asarray(x)).to(ctx.device), method=par.partition,
                          stages=n_stages, saved=saved_plan, peer=tp)  # fmt: skip
    if ctx.is_main:
        print(f"disttrain-trainer: {plan.describe()}", flush=True)
    loss_fn = loss_fn_for(ds)
    opt_spec, batch = spec.optimizer, spec.data.batch_size
    engine: Pipeline | PipeDreamStage
    if par.schedule == "PipeDream":
        ids = list(plan.blocks_of(pp_rank))
        module = nn.Sequential(*(blocks[k] for k in ids)).to(ctx.device)
        optimizer = build_optimizer(module.parameters(), opt_spec, batch)
        engine = PipeDreamStage(module=module, stage=pp_rank, stages=pp, optimizer=optimizer, loss_fn=loss_fn,
                                device=ctx.device, group=mesh.get_group("pp"))  # fmt: skip
        stage_root: nn.Module = module
    else:
        shard = stage_sharder(model, mesh["tp"], sequence_parallel=par.sequence_parallel) if tp > 1 else None
        engine = Pipeline(blocks, plan, schedule=par.schedule, microbatches=par.microbatches,
                          virtual=par.virtual_stages, pp_rank=pp_rank, pp_size=pp, group=mesh.get_group("pp"),
                          device=ctx.device, loss_fn=loss_fn, shard_stage=shard)  # fmt: skip
        ids = engine.block_ids
        stage_root = nn.ModuleList(engine.modules)
        optimizer = build_optimizer(engine.parameters(), opt_spec, batch)
    scheduler = build_scheduler(optimizer, opt_spec, batch, spec.training.steps)
    pm = PipelineMetrics(metrics, stage=pp_rank)
    pm.observe_plan(plan)
    run = PipeRun(cfg=cfg, ctx=ctx, ds=ds, full=full, full_blocks=split_blocks(full), blocks=blocks,
                  stage_root=stage_root, plan=plan, engine=engine, block_ids=ids, dp_rank=dp_rank, dp_size=dp,
                  pp_rank=pp_rank, tp_rank=tp_rank, dp_group=mesh.get_group("dp"), optimizer=optimizer,
                  scheduler=scheduler, sampler=sampler, metrics=metrics, pmetrics=pm)  # fmt: skip
    run.scaling.profiles = profiles  # rank 0's block profile: the forecast re-partitions it
    resume.seed_rank(spec.data.seed, 0, run.rng_stream)  # per-group streams (dropout), after identical init
    if loaded is not None:
        run.restore(loaded[1])
        if ctx.is_main:
            print(f"disttrain-trainer: resumed from step {run.step} ({cfg.checkpoint_dir})", flush=True)
    return run


def average_over_data(params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average a stage's gradients (this rank's tensor-parallel shards) with the other replicas' same stage."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _allreduce_grads(run: PipeRun) -> float:
    """Average stage i's gradients over the data-parallel replicas; returns the seconds it took."""
    if run.dp_size == 1:
        return 0.0
    t0 = time.perf_counter()
    average_over_data(run.optimizer.param_groups[0]["params"], run.dp_group, run.dp_size)
    return time.perf_counter() - t0


def _train_step(run: PipeRun, x: torch.Tensor, y: torch.Tensor) -> tuple[StepOut, float, float]:
    """Returns the engine's result, data-parallel all-reduce seconds and optimizer seconds."""
    m = run.cfg.spec.parallelism.microbatches
    if isinstance(run.engine, PipeDreamStage):
        out = run.engine.step(list(x.chunk(m)), list(y.chunk(m)), m)  # updates inside, per micro-batch
        run.scheduler.step()
        return out, 0.0, 0.0
    run.optimizer.zero_grad(set_to_none=True)
    out = run.engine.step(x, y)
    ar = _allreduce_grads(run)
    t0 = time.perf_counter()
    run.optimizer.step()
    run.scheduler.step()
    return out, ar, time.perf_counter() - t0


def _grad_bytes(run: PipeRun) -> int:
    """Bytes of this stage's gradients averaged over the data-parallel replicas per step (0: one replica)."""
    if run.dp_size == 1:
        return 0
    return sum(_local(p).numel() * p.element_size() for p in run.optimizer.param_groups[0]["params"])


def run_to_end(run: PipeRun, amp: Amp, wall0: float) -> dict[str, Any]:
    """Train the rest of the steps and write the final checkpoint, which carries the summary;
    a finished run resumed has nothing left to train and returns its summary."""
    if run.summary is not None and run.step >= run.cfg.spec.training.steps:
        return run.summary
    summary = loop(run, amp)
    summary["wallS"] = time.perf_counter() - wall0
    run.summary = summary
    run.save_checkpoint()
    return summary


def loop(run: PipeRun, amp: Amp) -> dict[str, Any]:
    spec, ctx = run.cfg.spec, run.ctx
    tr, pp = spec.training, spec.parallelism.pipeline
    n_stages = run.plan.stages
    grad_bytes = _grad_bytes(run)
    eval_result: tuple[str, float] | None = None
    last_loss = float("nan")
    interval, losses = Tally(), []
    start = time.perf_counter()
    with LoopGC() as loop_gc:
        while run.step < tr.steps:
            t0 = time.perf_counter()
            xb, yb = run.ds.batch(run.sampler.next_indices())
            x = torch.from_numpy(np.asarray(xb)).to(ctx.device)
            y = torch.from_numpy(np.asarray(yb)).to(ctx.device)
            t1 = time.perf_counter()
            out, ar_s, opt_s = _train_step(run, x, y)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            work = time.perf_counter() - t1
            # Every rank's timeline and loss: the pipeline's ranks split their idle time with them.
            everyone: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(everyone, ((run.dp_rank, run.tp_rank), out.intervals, out.loss))
            mine = (run.dp_rank, run.tp_rank)
            times = split_idle(out.intervals, [ivs for d, ivs, _ in everyone if d == mine], n_stages)
            step_losses = [ls for (_, t), _, ls in everyone if ls is not None and t == 0]  # one per replica
            last_loss = float(np.mean(step_losses)) if step_losses else float("nan")
            losses.append(last_loss)
            run.step += 1
            if tr.eval_interval_steps and run.step % tr.eval_interval_steps == 0 and run.step < tr.steps:
                eval_result = _evaluate(run, amp)
            if run.step % spec.checkpoint.interval_steps == 0 and run.step < tr.steps:  # the final one: run_to_end
                run.save_checkpoint()
            end = time.perf_counter()
            compute = min(work, times.compute_s + opt_s)
            comm = min(work - compute, times.p2p_s + ar_s)
            t2 = t1 + compute + comm  # the rest of the step, up to `end`, is idle
            run.metrics.observe_step_time(end - t0)
            interval.add_step(t0=t0, t1=t1, t2=t2, end=end, exposed_s=comm, busy_s=comm, idle_s=end - t2,
                              samples=len(x))  # fmt: skip
            run.pmetrics.observe_step(times, p2p_s=times.p2p_s, allreduce_s=ar_s, act_peak_bytes=out.act_peak_bytes)
            run.peak_bytes = max(run.peak_bytes, out.act_peak_bytes)
            run.bubble["bubble"] += times.bubble_s
            run.bubble["window"] += times.window_s
            if ends_interval(run.step, log_every=tr.log_interval_steps, steps=tr.steps):
                lr = run.scheduler.get_last_lr()[0]
                loss = float(np.mean(losses))
                run.metrics.observe_interval(
                    step=run.step, loss=loss, lr=lr, tally=interval, gradient_bytes=grad_bytes,
                    extra={"stage": run.pp_rank, "p2p_s": times.p2p_s, "allreduce_s": ar_s, "bubble_s": times.bubble_s,
                           "bubble_fraction": times.bubble_fraction, "window_s": times.window_s,
                           "act_peak_bytes": out.act_peak_bytes},
                )  # fmt: skip
                if ctx.is_main:
                    rec = interval.record()
                    print(f"step {run.step}/{tr.steps} loss {loss:.4f} lr {lr:.4g} "
                          f"samples/s {rec['samples_per_s'] * run.dp_size:.0f} bubble {times.bubble_fraction:.0%} "
                          f"comm {rec['comm_exposed_fraction']:.0%}", flush=True)  # fmt: skip
                run.totals.merge(interval)
                run.scaling.interval(interval)
                interval, losses = Tally(), []
            loop_gc.after_step(run.step)
    train_s = time.perf_counter() - start
    eval_result = _evaluate(run, amp)
    stage_totals: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(stage_totals, (run.dp_rank + run.tp_rank, run.pp_rank, run.totals, dict(run.bubble),
                                          run.peak_bytes))  # fmt: skip
    per_stage = [  # replica 0, tensor index 0
        {"stage": s, "bubbleFraction": b["bubble"] / b["window"] if b["window"] else 0.0,
         "computeFraction": t.fraction(t.compute_s), "idleFraction": t.fraction(t.idle_s),
         "commFraction": t.fraction(t.exposed_s), "activationPeakBytes": peak}
        for d, s, t, b, peak in sorted(stage_totals, key=lambda e: (e[0], e[1])) if d == 0
    ]  # fmt: skip
    t = run.totals
    # camelCase like every mode: this dict becomes the job's status.result.
    summary: dict[str, Any] = {
        "steps": run.step, "finalLoss": last_loss, "resumedFromStep": run.resumed_from,
        "restartAttempt": run.cfg.restart_attempt, "worldSize": ctx.world_size, "mode": spec.mode,
        "layout": layout_for(spec, ctx.world_size).describe(),
        "device": ctx.device.type, "backend": ctx.backend, "precision": tr.precision, "trainS": train_s,
        "samplesPerS": t.samples * run.dp_size / t.step_s if t.step_s else 0.0,
        # Fractions of step time; communication is all exposed here (busy = exposed).
        "commExposedFraction": t.fraction(t.exposed_s),
        "commFraction": t.fraction(t.exposed_s),
        "commBusyFraction": t.fraction(t.busy_s),
        "idleFraction": t.fraction(t.idle_s),
        "dataFraction": t.fraction(t.data_s),
        "computeFraction": t.fraction(t.compute_s),
        "pipeline": {"schedule": spec.parallelism.schedule, "stages": pp, "dataDegree": run.dp_size,
                     "tensorDegree": spec.parallelism.tensor,
                     "microbatches": spec.parallelism.microbatches, "plan": run.plan.to_json(),
                     "perStage": per_stage},
    }  # fmt: skip
    summary.update(throughput_fields(spec, vocab=run.ds.num_classes, samples_per_s=summary["samplesPerS"],
                                     device=ctx.device, accelerators=ctx.world_size))  # fmt: skip
    if eval_result is not None:
        summary[SUMMARY_EVAL_KEY[eval_result[0]]] = eval_result[1]
    summary["scaling"] = _scaling_block(run)
    return summary


def _scaling_block(run: PipeRun) -> dict[str, Any]:
    """The forecast's inputs (scaling_record.py); gathers each stage's compute (collective)."""
    spec, ctx = run.cfg.spec, run.ctx
    stage_compute = scaling_record.gather_stage_compute(run.scaling, run.totals, replica=run.dp_rank + run.tp_rank,
                                                        stage=run.pp_rank, world_size=ctx.world_size,
                                                        stages=spec.parallelism.pipeline)  # fmt: skip
    host = scaling_record.host_facts(world_size=ctx.world_size, nproc_per_node=run.cfg.nproc_per_node,
                                     master_addr=run.cfg.master_addr)  # fmt: skip
    pipe = scaling_record.pipeline_facts(run.scaling.profiles, run.plan.bounds, stage_compute)
    return scaling_record.summary_block(run.scaling, totals=run.totals, model=run.full,
                                        batch=spec.data.batch_size // run.dp_size, precision=spec.training.precision,
                                        host=host, pipeline=pipe)  # fmt: skip


def _evaluate(run: PipeRun, amp: Amp) -> tuple[str, float] | None:
    """Rank 0 gathers every stage's blocks into its whole model and evaluates it."""
    state = run.gather_blocks()
    result = None
    if state is not None:
        load_block_state(run.full_blocks, range(len(run.full_blocks)), state)
        run.full.to(run.ctx.device)
        result = evaluate(run.full, run.ds, amp)
        run.metrics.observe_eval(run.step, *result)
    return result
