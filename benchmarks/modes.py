"""The same GPT under every parallel mode a world size allows: what each gives and what it costs.

    python benchmarks/modes.py --world 2 --world 4

For each layout (data with DDP, data with FSDP2, tensor, tensor + sequence
parallel, hybrid DP x TP with FSDP2 or replication) real gloo processes train
the same GPT on the same global batch. Per layout:
  samples/s        global batch / step time (slowest rank; unprofiled steps),
  exposed          communication no computation overlaps / step time, and
  busy             time with a collective in flight / step time (both from
                   the profiler on separate profiled steps, parallel/comm_profile.py),
  MiB/step         collective payload per rank and step (profiler shapes x dtypes),
  state MiB        parameters + gradients + Adam moments held by one rank (local shards),
  peak RSS MiB     the process's peak resident memory (includes ~300 MiB of runtime),
  prof x           profiled / unprofiled step time: the profiler's own cost.
Pipeline layouts come with the pipeline mode (parallel/pipeline.py).
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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel.comm_profile import ProfiledComm
from disttrain_trainer.parallel.hybrid import apply_layout
from disttrain_trainer.parallel.mesh import Layout, build_mesh
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

    @property
    def world(self) -> int:
        return self.dp * self.tp


def cases(world: int) -> list[Case]:
    out = [Case(name="data (DDP)", dp=world, tp=1, strategy="ddp"),
           Case(name="data (FSDP2)", dp=world, tp=1, strategy="fsdp"),
           Case(name="tensor", dp=1, tp=world, strategy="ddp"),
           Case(name="tensor + SP", dp=1, tp=world, strategy="ddp", sp=True)]  # fmt: skip
    if world >= 4:
        out += [Case(name="hybrid DP2xTP (FSDP2)", dp=2, tp=world // 2, strategy="fsdp"),
                Case(name="hybrid DP2xTP (replicate) + SP", dp=2, tp=world // 2, strategy="ddp", sp=True)]  # fmt: skip
    return out


def _local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def _worker(rank: int, case: Case, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=case.world)
    try:
        torch.manual_seed(0)
        model = GPT(vocab=VOCAB, block_size=SEQ, dim=DIM, layers=LAYERS, heads=HEADS, dropout=0.0, act_ckpt="none")
        layout = Layout(dp=case.dp, pp=1, tp=case.tp, data_strategy=case.strategy, sequence_parallel=case.sp)
        if case.tp == 1 and case.strategy == "ddp":
            model = DDP(model)
            dp_rank = rank
        else:
            mesh = build_mesh(layout, "cpu")
            model = apply_layout(model, mesh=mesh, layout=layout, device=torch.device("cpu"))
            dp_rank = mesh["dp"].get_local_rank()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(1)
        comm = ProfiledComm(every=1)  # the profiled steps are chosen below

        def step() -> None:
            x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen).chunk(case.dp)[dp_rank]
            opt.zero_grad(set_to_none=True)
            with loss_parallel():
                logits = model(x[:, :-1])
                F.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1)).backward()
            opt.step()

        def timed(profiled: bool) -> float:
            dist.barrier()
            t0 = time.perf_counter()
            if profiled:
                with comm.step():
                    step()
            else:
                step()
            return time.perf_counter() - t0

        for _ in range(2):
            timed(False)
        plain = [timed(False) for _ in range(steps)]
        prof = []
        for _ in range(max(2, steps // 2)):
            step_s = timed(True)
            times = comm.take()
            prof.append((step_s, times.busy_s, comm.taken.bytes, times.exposed_s))
        params = list(model.parameters())
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
    }


def table(rows: list[dict]) -> str:
    head = ("| world | layout | samples/s | step ms | exposed | busy | MiB/step | state MiB/rank | "
            "peak RSS MiB | prof x |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    lines = [
        f"| {r['world']} | {r['name']} | {r['samples_per_s']:.1f} | {r['step_ms']:.0f} | {r['exposed_frac']:.0%} | "
        f"{r['busy_frac']:.0%} | {r['mib_per_step']:.2f} | {r['state_mib']:.2f} | {r['peak_rss_mib']:.0f} | "
        f"{r['profiler_x']:.2f} |"
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
