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

Throughput = tokens / wall time from the end of step `warmup` to the end of step
`steps - warmup` on rank 0; MFU = throughput x model FLOPs per token / the GPU's dense
peak for the precision (disttrain_trainer.telemetry.model_flops: the same formula the trainer's
summary reports). Runs alternate plain/disttrain per precision.

    python benchmarks/gpu_gpt.py [--precisions fp32,fp16,bf16] [--json out.json]
    python benchmarks/gpu_gpt.py --device cpu --tiny     # smoke test of the script itself
"""

from __future__ import annotations

import argparse
import json
import os
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
TINY = Shape(dim=64, layers=2, heads=2, block=64, batch=8, steps=12, warmup=3)
LR, WEIGHT_DECAY = 3e-4, 0.1


# ---------------------------------------------------------------- the user's script


def plain_worker(shape: Shape, precision: str, vocab: int, out: str) -> None:
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
    model = GPT(vocab, shape.block, shape.dim, shape.layers, shape.heads, 0.0, "none").to(dev)
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
            loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
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
    Path(out).write_text(json.dumps({"marks": marks}))
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


def run_plain(shape: Shape, precision: str, vocab: int, work: Path, device: str) -> float:
    out = work / f"plain-{precision}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1",
           f"--master-port={_free_port()}", __file__, "--plain", json.dumps(shape.__dict__), precision,
           str(vocab), str(out)]  # fmt: skip
    res = subprocess.run(cmd, env=_env(device), capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"plain loop failed:\n{(res.stdout + res.stderr)[-3000:]}")
    marks = {int(k): v for k, v in json.loads(out.read_text())["marks"].items()}
    return _tokens_per_s(marks, shape)


def _spec(shape: Shape, precision: str, device: str) -> dict[str, Any]:
    return {
        "mode": "data",
        "workers": {"replicas": 1, "resources": {"gpus": 1 if device == "cuda" else 0}},
        "model": {"name": "gpt", "hidden": shape.dim, "layers": shape.layers, "heads": shape.heads,
                  "blockSize": shape.block, "dropout": 0.0},
        "data": {"name": "pytext", "batchSize": shape.batch, "seed": 0},
        "optimizer": {"name": "adamw", "lr": LR, "weightDecay": WEIGHT_DECAY, "baseBatchSize": shape.batch},
        "training": {"steps": shape.steps, "precision": precision, "logIntervalSteps": shape.warmup},
        "checkpoint": {"intervalSteps": shape.steps, "keep": 1},
    }  # fmt: skip


def run_disttrain(shape: Shape, precision: str, work: Path, device: str) -> tuple[float, dict[str, Any]]:
    from disttrain_api import constants as C
    from disttrain_api.model import parse_spec, to_json

    job = f"gpt-{precision}"
    config = work / f"{job}.json"
    config.write_text(json.dumps(to_json(parse_spec(_spec(shape, precision, device)))))
    run_dir = work / "runs" / job
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
    return _tokens_per_s(marks, shape), summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # re-invoked by torchrun as the user's script
        shape_json, precision, vocab, out = argv[1:5]
        plain_worker(Shape(**json.loads(shape_json)), precision, int(vocab), out)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", default="fp32,fp16,bf16")
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
    shape = TINY if ns.tiny else GPT2_SMALL
    if ns.steps:
        shape = replace(shape, steps=ns.steps)
    vocab = len(vocabulary())
    per_token = gpt_flops_per_token(dim=shape.dim, layers=shape.layers, vocab=vocab, seq=shape.block)
    dev = torch.device(ns.device, 0) if ns.device == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(dev) if ns.device == "cuda" else "cpu"
    rows = []
    with tempfile.TemporaryDirectory(prefix="disttrain-gpu-gpt-") as tmp:
        work = Path(tmp)
        for i, precision in enumerate(ns.precisions.split(",")):
            if precision == "fp16" and ns.device == "cpu":
                continue  # fp16 training needs CUDA's GradScaler
            got: dict[str, Any] = {}
            for side in (("plain", "disttrain") if i % 2 == 0 else ("disttrain", "plain")):
                if side == "plain":
                    got["plain"] = run_plain(shape, precision, vocab, work, ns.device)
                else:
                    got["disttrain"], got["summary"] = run_disttrain(shape, precision, work, ns.device)
            peak = peak_flops(dev, precision)  # type: ignore[arg-type]
            mfu = {k: got[k] * per_token / peak if peak else None for k in ("plain", "disttrain")}
            row = {"precision": precision, "plain": got["plain"], "disttrain": got["disttrain"],
                   "ratio": got["disttrain"] / got["plain"], "mfuPlain": mfu["plain"],
                   "mfuDisttrain": mfu["disttrain"], "summaryTokensPerS": got["summary"].get("tokensPerS"),
                   "summaryMfu": got["summary"].get("mfu"), "backend": got["summary"]["backend"],
                   "finalLoss": got["summary"]["finalLoss"],
                   "fractions": {k: round(got["summary"][k], 4) for k in ("computeFraction", "dataFraction",
                                 "commExposedFraction", "commBusyFraction", "idleFraction")}}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{name}; GPT {shape.layers} layers x {shape.dim}, {shape.heads} heads, sequence {shape.block}, "
          f"vocabulary {vocab}, batch {shape.batch} ({shape.batch * shape.block} tokens/step); "
          f"{per_token / 1e6:.0f} MFLOP/token; window steps {shape.warmup}..{shape.steps - shape.warmup}; "
          f"torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print()
    print("| precision | plain tokens/s | disttrain tokens/s | ratio | MFU plain | MFU disttrain | "
          "disttrain summary tokens/s (whole run) | backend |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")

    def pct(v: float | None) -> str:
        return f"{v:.1%}" if v is not None else "n/a"

    for r in rows:
        print(f"| {r['precision']} | {r['plain']:.0f} | {r['disttrain']:.0f} | {r['ratio']:.3f} | "
              f"{pct(r['mfuPlain'])} | {pct(r['mfuDisttrain'])} | {r['summaryTokensPerS']:.0f} | "
              f"{r['backend']} |")  # fmt: skip
    if ns.json:
        Path(ns.json).write_text(json.dumps({"device": name, "shape": shape.__dict__, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
