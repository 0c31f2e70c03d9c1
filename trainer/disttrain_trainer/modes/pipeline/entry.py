"""The pipeline mode's entry: `mode: pipeline` and `mode: hybrid` with pipeline > 1.

Ranks form the job's (data, pipeline, tensor) DeviceMesh (parallel/mesh.py):
rank = (replica x pipeline + stage) x tensor + tensor index, so a stage's
tensor-parallel ranks are consecutive (one pod) and one pipeline's stages are
the next groups. Each rank holds its stages' blocks (schedules.py or,
for PipeDream, pipedream.py), with tensor > 1 sharded over mesh["tp"]
by the blocks' tensor-parallel plans (parallel/tensor.py); the ranks of one
tensor index form a pipeline over mesh["pp"]. With more than one replica, stage
i's gradients (this rank's shards) are averaged with the other replicas' stage i
over mesh["dp"].

The step loop and its time split: loop.py. Checkpoints hold every stage's blocks (keyed by global
block index, full tensors whatever the tensor degree), each stage's optimizer
(keyed by parameter name, full tensors), the plan and the RNG streams of every rank:
rank 0 writes them atomically after gathering the parts. The final checkpoint
also carries the summary: a finished run resumed returns it without training.
"""

from __future__ import annotations

import time

from ...collective_rank import collective_rank, run_local_ranks
from ...parallel.mesh import layout_for
from ...process import stop_request
from ...process.config import ConfigError, TrainerConfig
from ...process.dist_env import keep_until_exit
from ...run_common import Summary, mark_finished, write_summary
from ...telemetry import scaling_record
from ...telemetry.step_metrics import Metrics
from .loop import run_to_end
from .run_state import check_pipeline_model, setup


def check_supported(cfg: TrainerConfig) -> None:
    """Fail fast, before any process group exists, on what a pipeline cannot run."""
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



def main(cfg: TrainerConfig) -> Summary | None:
    """The mode's entry (modes/__init__.py): every local rank of this pod."""
    check_supported(cfg)
    return run_local_ranks(cfg, run)


def run(cfg: TrainerConfig, *, metrics: Metrics | None = None) -> Summary:
    """Train one rank to completion; returns the summary (rank 0 also writes summary.json)."""
    wall0 = time.perf_counter()
    check_supported(cfg)
    with collective_rank(cfg, metrics, check_model=lambda model, ds: check_pipeline_model(cfg, model, ds)) as rank:
        ctx = rank.ctx
        link = scaling_record.probe_link(ctx.device, ctx.world_size)  # the forecast's link (a fraction of a second)
        prun = setup(cfg, ctx, rank.ds, rank.model, rank.metrics)
        prun.scaling.link = link
        keep_until_exit(prun)
        with stop_request.deferred():  # the loop stops at an agreed step on SIGTERM
            summary = run_to_end(prun, rank.amp, wall0)
            if ctx.is_main:
                write_summary(cfg, summary, rank.metrics)
            mark_finished(cfg, ctx.rank, prun.step)
        return summary
