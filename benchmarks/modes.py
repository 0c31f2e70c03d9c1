"""The same GPT under every parallel mode a world size allows: what each gives and what it costs.

    python benchmarks/modes.py --world 2 --world 4

For each layout (data with DDP, data with FSDP2, tensor, tensor + sequence
parallel, hybrid DP x TP with FSDP2 or replication, pipeline, hybrid DP x PP and
PP x TP) real gloo processes train the same GPT on the same global batch. Per layout:
  samples/s        global batch / step time (slowest rank; unprofiled steps),
  exposed          communication no computation overlaps / step time, and
  busy             time with a collective or P2P op in flight / step time (both from
                   the profiler on separate profiled steps, parallel/comm_profile.py),
  MiB/step         collective payload per rank and step (profiler shapes x dtypes;
                   a pipeline rank counts each tensor it sends and each it receives),
  state MiB        parameters + gradients + Adam moments held by one rank (local shards),
  peak RSS MiB     the process's peak resident memory (includes ~300 MiB of runtime),
  prof x           profiled / unprofiled step time: the profiler's own cost,
  bubble           pipelines only: the schedule's idle time / pipeline window, mean
                   of the stages (stage_times.split_idle on the unprofiled steps).
A pipeline's P2P receive is in flight from when the schedule posts it until the
peer's tensor arrives, so its busy and exposed time include the bubble (waiting for
the peer stage to compute); the bubble column says how much of it that is.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from disttrain_trainer.models import GPT
from disttrain_trainer.modes.pipeline.loop import average_over_data
from disttrain_trainer.modes.pipeline.partition import BlockProfile, make_plan
from disttrain_trainer.modes.pipeline.schedules import Pipeline, StepOut, total_stages
from disttrain_trainer.modes.pipeline.stage_times import split_idle
from disttrain_trainer.parallel.blocks import split_blocks
from disttrain_trainer.parallel.comm_profile import ProfiledComm
from disttrain_trainer.parallel.hybrid import apply_layout
from disttrain_trainer.parallel.mesh import Layout, build_mesh
from disttrain_trainer.parallel.tensor import stage_sharder
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, SEQ, DIM, LAYERS, HEADS, BATCH = 64, 64, 128, 4, 4, 16


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    dp: int
    tp: int
    strategy: str  # "ddp" | "fsdp"
    sp: bool = False
    pp: int = 1
    schedule: str = "1F1B"  # pipelines only
    microbatches: int = 1  # per replica's batch, pipelines only

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def layout(self) -> Layout:
        return Layout(dp=self.dp, pp=self.pp, tp=self.tp, data_strategy=self.strategy, sequence_parallel=self.sp)


def cases(world: int) -> list[Case]:
    # Pipelines run 1F1B with m = 2p micro-batches per replica (the pipeline trainer's data strategy is ddp).
    out = [Case(name="data (DDP)", dp=world, tp=1, strategy="ddp"),
           Case(name="data (FSDP2)", dp=world, tp=1, strategy="fsdp"),
           Case(name="tensor", dp=1, tp=world, strategy="ddp"),
           Case(name="tensor + SP", dp=1, tp=world, strategy="ddp", sp=True),
           Case(name=f"pipeline (1F1B, m={2 * world})", dp=1, tp=1, pp=world, strategy="ddp",
                microbatches=2 * world)]  # fmt: skip
    if world >= 4:
        half = world // 2
        out += [Case(name="hybrid DP2xTP (FSDP2)", dp=2, tp=half, strategy="fsdp"),
                Case(name="hybrid DP2xTP (replicate) + SP", dp=2, tp=half, strategy="ddp", sp=True),
                Case(name=f"hybrid DP2xPP{half} (1F1B, m={2 * half})", dp=2, tp=1, pp=half, strategy="ddp",
                     microbatches=2 * half),
                Case(name=f"hybrid PP2xTP{half} (1F1B, m=4)", dp=1, tp=half, pp=2, strategy="ddp",
                     microbatches=4)]  # fmt: skip
    return out


def _local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


@dataclass(frozen=True, kw_only=True)
class Trainee:
    """One rank's part of a layout: a training step on its share of a batch and what it holds."""

    step: Callable[[torch.Tensor], StepOut | None]  # (rows, SEQ + 1) tokens -> a pipeline's StepOut or None
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    dp_rank: int
    pipe_key: tuple[int, int] | None = None  # (dp, tp) index of this rank's pipeline; None: no pipeline


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab=VOCAB, block_size=SEQ, dim=DIM, layers=LAYERS, heads=HEADS, dropout=0.0, act_ckpt="none")


def _flat(rank: int, case: Case) -> Trainee:
    """Data (DDP), or any data x tensor layout through the trainer's `apply_layout`."""
    model: torch.nn.Module = _gpt()
    if case.tp == 1 and case.strategy == "ddp":
        model = DDP(model)
        dp_rank = rank
    else:
        mesh = build_mesh(case.layout, "cpu")
        model = apply_layout(model, mesh=mesh, layout=case.layout, device=torch.device("cpu"))
        dp_rank = mesh["dp"].get_local_rank()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            _loss(model(x[:, :-1]), x[:, 1:]).backward()
        opt.step()

    return Trainee(step=step, params=list(model.parameters()), opt=opt, dp_rank=dp_rank)


def _pipelined(rank: int, case: Case) -> Trainee:
    """Pipeline, DP x PP and PP x TP as the pipeline mode (modes/pipeline/) builds and steps them: the GPT's blocks
    cut into stages, each stage sharded over mesh["tp"], replicas' stage gradients averaged
    over mesh["dp"]. The plan is the trainer's `partition: params` (equal parameter counts):
    deterministic, so the memory and bytes columns are too, where `profile` times the blocks."""
    model = _gpt()
    mesh = build_mesh(case.layout, "cpu")
    dp_rank, pp_rank, tp_rank = (mesh[d].get_local_rank() for d in ("dp", "pp", "tp"))
    blocks = split_blocks(model)
    sizes = [BlockProfile(seconds=0.0, out_bytes=0, params=sum(p.numel() for p in b.parameters())) for b in blocks]
    plan = make_plan("params", sizes, total_stages(case.schedule, case.pp, 1), bytes_per_s=0.0)
    shard = stage_sharder(model, mesh["tp"], sequence_parallel=case.sp) if case.tp > 1 else None
    pipe = Pipeline(blocks, plan, schedule=case.schedule, microbatches=case.microbatches, virtual=1,
                    pp_rank=pp_rank, pp_size=case.pp, group=mesh.get_group("pp"), device=torch.device("cpu"),
                    loss_fn=_loss, shard_stage=shard)  # fmt: skip
    params = pipe.parameters()
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step(x: torch.Tensor) -> StepOut:
        opt.zero_grad(set_to_none=True)
        out = pipe.step(x[:, :-1], x[:, 1:])
        if case.dp > 1:
            average_over_data(params, mesh.get_group("dp"), case.dp)
        opt.step()
        return out

    return Trainee(step=step, params=params, opt=opt, dp_rank=dp_rank, pipe_key=(dp_rank, tp_rank))


def _bubble(me: Trainee, out: StepOut | None, case: Case) -> float:
    """This stage's bubble fraction of the step just run, from its pipeline's compute timelines (collective)."""
    everyone: list[Any] = [None] * case.world
    dist.all_gather_object(everyone, (me.pipe_key, out.intervals if out is not None else []))
    if out is None:
        return 0.0
    return split_idle(out.intervals, [ivs for key, ivs in everyone if key == me.pipe_key], case.pp).bubble_fraction


def _worker(rank: int, case: Case, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=case.world)
    try:
        me = _pipelined(rank, case) if case.pp > 1 else _flat(rank, case)
        gen = torch.Generator().manual_seed(1)
        comm = ProfiledComm(every=1)  # the profiled steps are chosen below
        bubbles: list[float] = []

        def timed(profiled: bool) -> float:
            x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen).chunk(case.dp)[me.dp_rank]
            dist.barrier()
            t0 = time.perf_counter()
            if profiled:
                with comm.step():
                    res = me.step(x)
            else:
                res = me.step(x)
            seconds = time.perf_counter() - t0
            if case.pp > 1 and not profiled:
                bubbles.append(_bubble(me, res, case))
            return seconds

        for _ in range(2):
            timed(False)
        plain = [timed(False) for _ in range(steps)]
        prof = []
        for _ in range(max(2, steps // 2)):
            step_s = timed(True)
            times = comm.take()
            prof.append((step_s, times.busy_s, comm.taken.bytes, times.exposed_s))
        params, opt = me.params, me.opt
        state = sum(_local_bytes(p) + (_local_bytes(p.grad) if p.grad is not None else 0) for p in params)
        state += sum(_local_bytes(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
        result = {
            "step_s": statistics.median(plain),
            "prof_step_s": statistics.median(p[0] for p in prof),
            "busy_s": statistics.median(p[1] for p in prof),
            "bytes": statistics.median(p[2] for p in prof),
            "exposed_s": statistics.median(p[3] for p in prof),
            "state_bytes": state,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "bubble": statistics.mean(bubbles[2:]) if bubbles else None,  # after the warmup steps
            "by_kind": comm.taken.by_kind,
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_case(case: Case, steps: int) -> dict[str, float | str | int]:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(case, _port(), steps, out), nprocs=case.world, join=True,
                           start_method="fork")  # fmt: skip
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(case.world)]
    step_s = max(r["step_s"] for r in ranks)
    prof_s = max(r["prof_step_s"] for r in ranks)
    return {
        **asdict(case),
        "world": case.world,
        "samples_per_s": BATCH / step_s,
        "step_ms": 1e3 * step_s,
        "exposed_frac": max(r["exposed_s"] / r["prof_step_s"] for r in ranks),
        "busy_frac": max(r["busy_s"] / r["prof_step_s"] for r in ranks),
        "mib_per_step": max(r["bytes"] for r in ranks) / 2**20,
        "state_mib": max(r["state_bytes"] for r in ranks) / 2**20,
        "peak_rss_mib": max(r["peak_rss"] for r in ranks) / 2**20,
        "profiler_x": prof_s / step_s,
        "bubble_frac": statistics.mean(r["bubble"] for r in ranks) if case.pp > 1 else None,
        "by_kind_per_rank": [r["by_kind"] for r in ranks],
    }


def table(rows: list[dict]) -> str:
    head = ("| world | layout | samples/s | step ms | exposed | busy | MiB/step | state MiB/rank | "
            "peak RSS MiB | prof x | bubble |\n|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    lines = [
        f"| {r['world']} | {r['name']} | {r['samples_per_s']:.1f} | {r['step_ms']:.0f} | {r['exposed_frac']:.0%} | "
        f"{r['busy_frac']:.0%} | {r['mib_per_step']:.2f} | {r['state_mib']:.2f} | {r['peak_rss_mib']:.0f} | "
        f"{r['profiler_x']:.2f} | {'-' if r['bubble_frac'] is None else format(r['bubble_frac'], '.0%')} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, action="append", help="world sizes (default: 2)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per layout (and half as many profiled)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    rows = []
    for world in args.world or [2]:
        for case in cases(world):
            rows.append(run_case(case, args.steps))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\nGPT dim {DIM}, {LAYERS} layers, {HEADS} heads, seq {SEQ}, vocab {VOCAB}, global batch {BATCH}, "
          f"fp32, AdamW, gloo on CPU, 1 thread per rank; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
