"""The GPT model on one GPU: disttrain's trainer vs a plain torchrun + DDP loop, fp32 / fp16 / bf16.

Both sides train the trainer's GPT class (nanoGPT-style, pre-LN, causal SDPA) with the
same shape, global batch, AdamW and precision on one CUDA device with NCCL (world 1):

  plain:     `python -m torch.distributed.run --nproc-per-node 1 gpu_gpt.py --plain ...`
             runs `plain_worker` below: random token windows already on the GPU (no data
             loading at all, so it is the loop's ceiling), DDP as it comes, autocast (and a
             GradScaler for fp16), the loss read once per log interval.
  disttrain: `python -m disttrain_trainer` with the env contract `disttrain local` sets:
             the pytext shards memory-mapped and copied to the GPU every step, metrics on,
             checkpoint and evaluation at the end (outside the window).

Both sides take the same switches: `--compile MODE` compiles each transformer block and the
loss (the plain side as a user following torchtitan would: `torch.compile` of every block's
forward; disttrain's `training.compile`), `--float8` swaps the large linears for torchao's
Float8Linear with the same filter (disttrain_trainer.parallel.float8.converts;
`training.float8`).

Throughput = tokens / wall time from the end of step `warmup` to the end of step
`steps - warmup` on rank 0 (compilation happens in the first steps, outside the window);
MFU = throughput x model FLOPs per token / the GPU's dense peak for the precision
(disttrain_trainer.telemetry.model_flops: the same formula the trainer's summary reports).
Each configuration runs `--rounds` rounds (default 5), each round one plain and one disttrain
process, the order alternating, so a drift of the GPU's clocks meets both sides alike; the
table gives the median of the per-round ratios, the plain side's round-to-round spread
((max - min) / median: the window is long enough when it is under 3%), the median MFU and the
peak memory of each rank (torch.cuda.max_memory_allocated; disttrain's from its summary).

    python benchmarks/gpu_gpt.py [--shapes example,1.3b] [--precisions bf16] [--compile default] [--float8]
                                 [--rounds 5] [--json out.json]
    python benchmarks/gpu_gpt.py --device cpu --tiny --rounds 1   # smoke test of the script itself
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for sub in ("operator", "trainer"):  # runnable from a checkout without installing the package
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))


@dataclass(frozen=True, kw_only=True)
class Shape:
    dim: int
    layers: int
    heads: int
    block: int
    batch: int
    steps: int
    warmup: int  # also the log interval of both sides


GPT2_SMALL = Shape(dim=768, layers=12, heads=12, block=1024, batch=16, steps=60, warmup=10)
# The 1.3B shape (GPT-3 XL's width and depth at the example's context): 1.3e9 parameters.
GPT_1_3B = Shape(dim=2048, layers=24, heads=16, block=1024, batch=8, steps=40, warmup=10)
TINY = Shape(dim=64, layers=2, heads=2, block=64, batch=8, steps=12, warmup=3)
SHAPES = {"example": GPT2_SMALL, "1.3b": GPT_1_3B}
SPREAD_LIMIT = 0.03
LR, WEIGHT_DECAY = 3e-4, 0.1


# ---------------------------------------------------------------- the user's script


def plain_worker(shape: Shape, precision: str, vocab: int, out: str, compile_mode: str = "", float8: bool = False) -> None:
    """A plain torchrun + DDP loop on one GPU, written as a user would write it."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from disttrain_trainer.models import GPT
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = torch.cuda.is_available() and os.environ.get("GPU_GPT_DEVICE", "cuda") == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    model = GPT(vocab, shape.block, shape.dim, shape.layers, shape.heads, 0.0, "none")
    if float8:  # torchao's float8 linears, the layers disttrain's filter picks
        from disttrain_trainer.parallel.float8 import converts
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=converts)
    model = model.to(dev)

    def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    if compile_mode:  # each block's forward and the loss, as torchtitan does
        for block in model.blocks:
            block.forward = torch.compile(block.forward, mode=compile_mode)
        loss_of = torch.compile(loss_of, mode=compile_mode)
    ddp = DDP(model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    data = torch.randint(0, vocab, (8, shape.batch, shape.block + 1), device=dev)
    marks: dict[int, float] = {}
    for step in range(1, shape.steps + 1):
        w = data[step % len(data)]
        x, y = w[:, :-1], w[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_of(ddp(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if step % shape.warmup == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)  # .item() syncs the GPU
            marks[step] = time.time()
    peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    Path(out).write_text(json.dumps({"marks": marks, "peakMemoryBytes": peak}))
    dist.destroy_process_group()


# ---------------------------------------------------------------- the two sides


def _free_port() -> int:
    from disttrain_trainer.launcher.env import reserve_ports

    return reserve_ports(1)[0]


def _tokens_per_s(marks: dict[int, float], shape: Shape) -> float:
    first, last = shape.warmup, shape.steps - shape.warmup
    return (last - first) * shape.batch * shape.block / (marks[last] - marks[first])


def _env(device: str) -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "GPU_GPT_DEVICE": device}


@dataclass(frozen=True, kw_only=True)
class Config:
    shape_name: str
    shape: Shape
    precision: str
    compile_mode: str  # "" = eager
    float8: bool

    def describe(self) -> str:
        return (f"{self.shape_name} {self.precision} {'compile ' + self.compile_mode if self.compile_mode else 'eager'}"
                f"{' float8' if self.float8 else ''}")  # fmt: skip


def run_plain(cfg: Config, vocab: int, work: Path, device: str) -> tuple[float, int | None]:
    out = work / "plain.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1",
           f"--master-port={_free_port()}", __file__, "--plain", json.dumps(cfg.shape.__dict__), cfg.precision,
           str(vocab), str(out), cfg.compile_mode or "-", "1" if cfg.float8 else "0"]  # fmt: skip
    res = subprocess.run(cmd, env=_env(device), capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"plain loop failed:\n{(res.stdout + res.stderr)[-3000:]}")
    got = json.loads(out.read_text())
    marks = {int(k): v for k, v in got["marks"].items()}
    return _tokens_per_s(marks, cfg.shape), got.get("peakMemoryBytes")


def _spec(cfg: Config, device: str) -> dict[str, Any]:
    shape = cfg.shape
    return {
        "mode": "data",
        "workers": {"replicas": 1, "resources": {"gpus": 1 if device == "cuda" else 0}},
        "model": {"name": "gpt", "hidden": shape.dim, "layers": shape.layers, "heads": shape.heads,
                  "blockSize": shape.block, "dropout": 0.0},
        "data": {"name": "pytext", "batchSize": shape.batch, "seed": 0},
        "optimizer": {"name": "adamw", "lr": LR, "weightDecay": WEIGHT_DECAY, "baseBatchSize": shape.batch},
        "training": {"steps": shape.steps, "precision": cfg.precision, "logIntervalSteps": shape.warmup,
                     "compile": cfg.compile_mode or False, "float8": cfg.float8},
        "checkpoint": {"intervalSteps": shape.steps, "keep": 1},
    }  # fmt: skip


def run_disttrain(cfg: Config, work: Path, device: str) -> tuple[float, dict[str, Any]]:
    from disttrain_api import constants as C
    from disttrain_api.model import parse_spec, to_json

    job = f"gpt-{cfg.precision}"
    config = work / f"{job}.json"
    config.write_text(json.dumps(to_json(parse_spec(_spec(cfg, device)))))
    run_dir = work / "runs" / job
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(work / "ckpt", ignore_errors=True)  # every round trains from step 0
    env = {
        **_env(device),
        C.ENV_CONFIG: str(config), C.ENV_WORLD_SIZE: "1", C.ENV_RANK: "0", C.ENV_LOCAL_RANK: "0",
        C.ENV_NODE_RANK: "0", C.ENV_NPROC_PER_NODE: "1", C.ENV_MASTER_ADDR: "127.0.0.1",
        C.ENV_MASTER_PORT: str(_free_port()), C.ENV_JOB: job, C.ENV_CHECKPOINT_DIR: str(work / "ckpt"),
        C.ENV_RUN_DIR: str(run_dir), C.ENV_METRICS_PORT: "0", C.ENV_DATA_CACHE: str(work / "data"),
        C.ENV_DEVICE: device,
    }  # fmt: skip
    res = subprocess.run([sys.executable, "-m", "disttrain_trainer"], env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"disttrain trainer failed:\n{(res.stdout + res.stderr)[-3000:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics-rank0.jsonl").read_text().splitlines()]
    marks = {int(r["step"]): float(r["time"]) for r in recs if "event" not in r}
    summary = json.loads((run_dir / "summary.json").read_text())
    return _tokens_per_s(marks, cfg.shape), summary


def measure(cfg: Config, *, rounds: int, vocab: int, per_token: float, peak: float | None, work: Path,
            device: str) -> dict[str, Any]:  # fmt: skip
    """`rounds` rounds of both sides, alternating which goes first; medians and the plain side's spread."""
    plain, mine, ratios, summaries, plain_peak = [], [], [], [], None
    for i in range(rounds):
        for side in (("plain", "disttrain") if i % 2 == 0 else ("disttrain", "plain")):
            if side == "plain":
                tps, plain_peak = run_plain(cfg, vocab, work, device)
                plain.append(tps)
            else:
                tps, summary = run_disttrain(cfg, work, device)
                mine.append(tps)
                summaries.append(summary)
        ratios.append(mine[-1] / plain[-1])
    med_plain, med_mine = statistics.median(plain), statistics.median(mine)
    spread = (max(plain) - min(plain)) / med_plain if med_plain else 0.0
    last = summaries[-1]

    def mfu(tps: float) -> float | None:
        return tps * per_token / peak if peak else None

    return {"config": cfg.describe(), "shape": cfg.shape_name, "precision": cfg.precision,
            "compile": cfg.compile_mode or None, "float8": cfg.float8, "rounds": rounds,
            "plain": plain, "disttrain": mine, "ratio": statistics.median(ratios), "ratios": ratios,
            "plainSpread": spread, "spreadOk": spread < SPREAD_LIMIT,
            "mfuPlain": mfu(med_plain), "mfuDisttrain": mfu(med_mine),
            "peakMemoryBytesPlain": [plain_peak] if plain_peak is not None else None,
            "peakMemoryBytesPerRank": last.get("peakMemoryBytesPerRank"),
            "summaryTokensPerS": last.get("tokensPerS"), "summarySteadyTokensPerS": last.get("steadyTokensPerS"),
            "summaryMfu": last.get("mfu"), "summarySteadyMfu": last.get("steadyMfu"), "compileS": last.get("compileS"),
            "recompiles": last.get("recompiles"), "backend": last["backend"], "finalLoss": last["finalLoss"]}  # fmt: skip


def _configs(ns: argparse.Namespace) -> list[Config]:
    shapes = {"tiny": TINY} if ns.tiny else {k: SHAPES[k] for k in ns.shapes.split(",")}
    out = []
    for name, shape in shapes.items():
        if ns.steps:
            shape = replace(shape, steps=ns.steps)
        for precision in ns.precisions.split(","):
            if precision == "fp16" and ns.device == "cpu":
                continue  # fp16 training needs CUDA's GradScaler
            out.append(Config(shape_name=name, shape=shape, precision=precision, compile_mode=ns.compile,
                              float8=ns.float8))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # re-invoked by torchrun as the user's script
        shape_json, precision, vocab, out, compile_mode, float8 = argv[1:7]
        plain_worker(Shape(**json.loads(shape_json)), precision, int(vocab), out,
                     "" if compile_mode == "-" else compile_mode, float8 == "1")  # fmt: skip
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="example", help="example (GPT-2 small), 1.3b, or both: example,1.3b")
    p.add_argument("--precisions", default="fp32,fp16,bf16")
    p.add_argument("--compile", default="", help="a torch.compile mode for both sides (default, "
                   "max-autotune-no-cudagraphs); empty: eager")
    p.add_argument("--float8", action="store_true", help="torchao float8 linears on both sides (compute capability 8.9+)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a 2-layer model for a smoke test")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)

    import torch
    from disttrain_trainer.data import vocabulary
    from disttrain_trainer.telemetry.model_flops import gpt_flops_per_token, peak_flops

    if ns.device == "cuda" and not torch.cuda.is_available():
        print("gpu_gpt.py needs a CUDA GPU (or --device cpu --tiny for a smoke test)", file=sys.stderr)
        return 2
    vocab = len(vocabulary())
    dev = torch.device(ns.device, 0) if ns.device == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(dev) if ns.device == "cuda" else "cpu"
    rows = []
    with tempfile.TemporaryDirectory(prefix="disttrain-gpu-gpt-") as tmp:
        for cfg in _configs(ns):
            shape = cfg.shape
            per_token = gpt_flops_per_token(dim=shape.dim, layers=shape.layers, vocab=vocab, seq=shape.block)
            # float8 matmuls run at twice bf16's peak, but MFU is quoted against the bf16 peak (as torchtitan does).
            peak = peak_flops(dev, cfg.precision)  # type: ignore[arg-type]
            row = measure(cfg, rounds=ns.rounds, vocab=vocab, per_token=per_token, peak=peak, work=Path(tmp),
                          device=ns.device)  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
            if ns.json:  # after every configuration: a run cut short by a timeout keeps what it measured
                Path(ns.json).write_text(json.dumps({"device": name, "torch": torch.__version__, "rows": rows}, indent=2))
    print()
    print(f"{name}; torch {torch.__version__}; vocabulary {vocab}; {ns.rounds} rounds a configuration, sides "
          f"alternating; {time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print()
    print("| configuration | plain tokens/s (median) | disttrain tokens/s (median) | ratio (median) | plain spread | "
          "MFU plain | MFU disttrain | peak memory per rank (GB) | disttrain summary: whole run / steady tokens/s | "
          "compile s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def pct(v: float | None) -> str:
        return f"{v:.1%}" if v is not None else "n/a"

    def gb(v: list[int] | None) -> str:
        return ", ".join(f"{b / 1e9:.1f}" for b in v) if v else "n/a"

    for r in rows:
        flag = "" if r["spreadOk"] else " (over 3%: longer window)"
        steady = r["summarySteadyTokensPerS"]
        print(f"| {r['config']} | {statistics.median(r['plain']):.0f} | {statistics.median(r['disttrain']):.0f} | "
              f"{r['ratio']:.3f} | {r['plainSpread']:.1%}{flag} | {pct(r['mfuPlain'])} | {pct(r['mfuDisttrain'])} | "
              f"{gb(r['peakMemoryBytesPerRank'])} | {r['summaryTokensPerS']:.0f} / "
              f"{steady if steady is None else f'{steady:.0f}'} | {r['compileS'] or 0:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
