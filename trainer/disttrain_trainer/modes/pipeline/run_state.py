"""A pipeline rank's run state: its stages' blocks and optimizer, the plan, the sampler and RNG
streams, and the checkpoints that carry them (gathered to rank 0, written whole).

`setup` builds it: the mesh, the plan (profiled, or the checkpoint's), this rank's stages
(a synchronous schedule from schedules.py or PipeDream from pipedream.py, sharded over
mesh["tp"] when tensor > 1), and the state of the checkpoint the gang agreed on.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from disttrain_api.model import JobSpec
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from ...checkpoints import rank_state, resume
from ...checkpoints import whole as ckpt
from ...checkpoints.fence import Fenced, Writer
from ...data import Dataset, GlobalBatchSampler
from ...optim import build_optimizer, build_scheduler
from ...parallel.block_compile import apply_compile, compile_loss, loss_mode
from ...parallel.blocks import block_state, check_chain, load_block_state, split_blocks
from ...parallel.mesh import build_mesh, layout_for
from ...parallel.tensor import stage_sharder
from ...process.config import ConfigError, TrainerConfig
from ...process.dist_env import DistContext
from ...run_common import loss_fn_for
from ...telemetry import scaling_record
from ...telemetry.step_metrics import Metrics, Tally
from .partition import Plan
from .pipedream import PipeDreamStage
from .plan import choose_plan
from .schedules import Pipeline, total_stages
from .stage_metrics import PipelineMetrics


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
        part = {"rng": rank_state.rng_state(), **self._stage_part()}
        if self.dp_rank == 0:
            optim = get_optimizer_state_dict(self.stage_root, self.optimizer, options=FULL)
            if self.tp_rank == 0:
                part |= {"pp_rank": self.pp_rank, "optimizer": optim}
        parts = self._gather(part)
        info: list[Any] = [0.0, 0, ""]  # seconds, bytes, why rank 0 was fenced
        if parts is not None:
            state = {
                "step": self.step, "world_size": self.ctx.world_size, "plan": self.plan.to_json(),
                "blocks": {k: v for p in parts for k, v in p.get("blocks", {}).items()},
                "optimizers": {p["pp_rank"]: p["optimizer"] for p in parts if "optimizer" in p},
                "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": [p["rng"] for p in parts], "summary": self.summary,
            }  # fmt: skip
            try:
                res = ckpt.save(self.cfg.checkpoint_dir, state, self.step, keep=self.cfg.spec.checkpoint.keep,
                                world_size=self.ctx.world_size)  # fmt: skip
                info = [res.seconds, res.bytes, ""]
            except Fenced as e:
                info = [0.0, 0, str(e)]
        dist.broadcast_object_list(info, src=0)  # also a barrier: nobody runs ahead of a half-written save
        if info[2]:
            raise Fenced(info[2])  # on every rank: the whole replaced gang stops
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
            rank_state.set_rng_state(rngs[self.ctx.rank])
        else:  # resharded: no saved stream belongs to this rank
            rank_state.seed_rank(self.cfg.spec.data.seed, self.step, self.rng_stream)

    @property
    def rng_stream(self) -> int:
        """One stream per tensor-parallel group: its replicated activations see the same dropout masks."""
        return self.ctx.rank // self.cfg.spec.parallelism.tensor


# Optimizer state with full tensors keyed by parameter name: gathered from the tensor-parallel
# shards when saved (collective over mesh["tp"]), this rank's shards cut again when loaded.
FULL = StateDictOptions(full_state_dict=True)


def _cpu(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in d.items()}


def _microbatch_rows(spec: JobSpec, dp: int) -> int:
    return spec.data.batch_size // dp // spec.parallelism.microbatches


def check_pipeline_model(cfg: TrainerConfig, model: nn.Module, ds: Dataset) -> None:
    """What cutting `model` into this job's stages needs beyond its blocks (model_contract): a block
    for every stage, and blocks that applied in turn compute model(x) on a micro-batch of the data.
    collective_rank runs it on every rank before the first collective: raised later (after the
    device mesh), a rank that got there first left while a peer was still creating a group through
    its store, and the peer failed with a broken pipe (exit 1) instead of this ConfigError."""
    spec = cfg.spec
    par, layout = spec.parallelism, layout_for(spec, cfg.world_size)
    blocks = split_blocks(model, name=spec.model.name)
    n_stages = total_stages(par.schedule, layout.pp, par.virtual_stages)
    if len(blocks) < n_stages:
        raise ConfigError(f"model {spec.model.name} has {len(blocks)} blocks, fewer than the {n_stages} stages of "
                          f"parallelism.pipeline {layout.pp} x virtualStages; use more layers or fewer stages")  # fmt: skip
    x, _ = ds.batch(np.arange(_microbatch_rows(spec, layout.dp)))
    check_chain(model, blocks, torch.from_numpy(np.asarray(x)), name=spec.model.name)


def setup(cfg: TrainerConfig, ctx: DistContext, ds: Dataset, model: nn.Module, metrics: Metrics) -> PipeRun:
    spec = cfg.spec
    par = spec.parallelism
    layout = layout_for(spec, ctx.world_size)
    pp, dp, tp = layout.pp, layout.dp, layout.tp
    mesh = build_mesh(layout, ctx.device.type)
    dp_rank, pp_rank, tp_rank = (mesh[d].get_local_rank() for d in ("dp", "pp", "tp"))
    # Rank 0 evaluates a plain copy: the tensor-parallel blocks need their whole group in every forward.
    full = copy.deepcopy(model) if tp > 1 and ctx.is_main else model
    blocks = split_blocks(model, name=spec.model.name)  # (checked: check_pipeline_model)
    n_stages = total_stages(par.schedule, pp, par.virtual_stages)
    loaded = resume.agree_on_checkpoint(cfg.checkpoint_dir, ctx, writer=Writer.of(cfg))
    saved_plan = Plan.from_json(loaded[1]["plan"]) if loaded else None
    sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, dp_rank, dp)
    x, _ = ds.batch(np.arange(_microbatch_rows(spec, dp)))  # the partitioner's profiling input
    plan, profiles = choose_plan(blocks, torch.from_numpy(np.asarray(x)).to(ctx.device), method=par.partition,
                          stages=n_stages, saved=saved_plan, peer=tp)  # fmt: skip
    if ctx.is_main:
        print(f"disttrain-trainer: {plan.describe()}", flush=True)
    mode = spec.training.compile_mode
    loss_fn = compile_loss(loss_fn_for(ds), loss_mode(mode, tensor_parallel=tp > 1))
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
    if mode is not None:  # after the profile (eager block times) and the stages' tensor-parallel sharding
        apply_compile(model, mode, name=spec.model.name)  # the blocks are the stages' own modules
    scheduler = build_scheduler(optimizer, opt_spec, batch, spec.training.steps)
    pm = PipelineMetrics(metrics, stage=pp_rank)
    pm.observe_plan(plan)
    run = PipeRun(cfg=cfg, ctx=ctx, ds=ds, full=full, full_blocks=split_blocks(full), blocks=blocks,
                  stage_root=stage_root, plan=plan, engine=engine, block_ids=ids, dp_rank=dp_rank, dp_size=dp,
                  pp_rank=pp_rank, tp_rank=tp_rank, dp_group=mesh.get_group("dp"), optimizer=optimizer,
                  scheduler=scheduler, sampler=sampler, metrics=metrics, pmetrics=pm)  # fmt: skip
    run.scaling.profiles = profiles  # rank 0's block profile: the forecast re-partitions it
    rank_state.seed_rank(spec.data.seed, 0, run.rng_stream)  # per-group streams (dropout), after identical init
    if loaded is not None:
        run.restore(loaded[1])
        if ctx.is_main:
            print(f"disttrain-trainer: resumed from step {run.step} ({cfg.checkpoint_dir})", flush=True)
    return run


