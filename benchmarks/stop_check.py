"""What the SIGTERM agreement (trainer process/stop_agreement.py) costs the data-parallel loop, on 2 gloo processes.

The trainer's own step (data, DDP forward/backward, fused SGD) of the digits MLP that
vs_torchrun.py uses, in one gang, in alternating blocks: with `StopAgreement.should_stop` after
every step, each one a check (max_every 1: the worst case, a launch and a read per step) or
without it. Blocks alternate so load drift hits both alike; the figure is the median of the
paired block differences on rank 0. The loop checks about once per CHECK_PERIOD_S (1 s) of
training (never less often than every quarter of the grace period), so its cost per step is the
per-check cost times the step time / 1 s.

    .venv/bin/python benchmarks/stop_check.py [--blocks 30 --block-steps 100 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from disttrain_api import model as api
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.models import build_model
from disttrain_trainer.modes.data import layouts
from disttrain_trainer.optim import build_optimizer, build_scheduler
from disttrain_trainer.parallel.ddp import train_step
from disttrain_trainer.process.config import config_for
from disttrain_trainer.process.dist_env import cleanup, init_distributed
from disttrain_trainer.process.precision import make_amp
from disttrain_trainer.process.stop_agreement import CHECK_PERIOD_S, StopAgreement
from disttrain_trainer.run_common import loss_fn_for

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, blocks: int, block_steps: int, port: int, workdir: str, out: str) -> None:
    torch.set_num_threads(1)
    spec = api.parse_spec({
        "mode": "data", "workers": {"replicas": WORLD}, "model": {"name": "mlp", "hidden": 128, "layers": 2},
        "data": {"name": "digits", "batchSize": 128, "seed": 0, "shards": 2},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "decay": "none"},
        "training": {"steps": 10**6},
    })  # fmt: skip
    work = Path(workdir)
    cfg = config_for(spec, job="bench", rank=rank, world_size=WORLD, run_dir=work / "run",
                     checkpoint_root=work / "ckpt", master_port=port, metrics_port=0)  # fmt: skip
    ctx = init_distributed(cfg)
    try:
        if rank == 0:
            ds = load_dataset(spec, work / "data")
        dist.barrier()
        if rank != 0:
            ds = load_dataset(spec, work / "data")
        amp = make_amp("fp32", ctx.device)
        loss_fn = loss_fn_for(ds)
        inner = build_model(spec, ds)
        model = layouts.apply(inner, mesh=ctx, cfg=cfg)
        opt = build_optimizer(inner.parameters(), spec.optimizer, spec.data.batch_size)
        sched = build_scheduler(opt, spec.optimizer, spec.data.batch_size, spec.training.steps)
        sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed, rank, WORLD)
        agreement = StopAgreement(grace_s=30.0, max_every=1)

        def step() -> None:
            x, y = ds.batch(sampler.next_indices())
            train_step(model, [(torch.from_numpy(x), torch.from_numpy(y))], loss_fn=loss_fn, optimizer=opt,
                       scheduler=sched, amp=amp)  # fmt: skip

        for _ in range(50):
            step()
        n = 0
        agreement.start(n)
        per_step: dict[bool, list[float]] = {True: [], False: []}
        for b in range(2 * blocks):
            on = b % 2 == 0
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(block_steps):
                step()
                n += 1
                if on:
                    assert not agreement.should_stop(n)
            per_step[on].append((time.perf_counter() - t0) / block_steps)
        agreement.close()
        if rank == 0:
            Path(out).write_text(json.dumps({"on": per_step[True], "off": per_step[False]}))
    finally:
        cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=30, help="blocks per side")
    p.add_argument("--block-steps", type=int, default=100)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.json")
        mp.start_processes(_worker, args=(a.blocks, a.block_steps, _free_port(), tmp, out), nprocs=WORLD,
                           start_method="spawn")  # fmt: skip
        got = json.loads(Path(out).read_text())
    on, off = got["on"], got["off"]
    diffs = [x - y for x, y in zip(on, off, strict=True)]
    check_us = statistics.median(diffs) * 1e6
    step_us = statistics.median(off) * 1e6
    every = max(1, int(CHECK_PERIOD_S / (step_us * 1e-6)))  # the loop's own spacing of checks for this step
    result: dict[str, Any] = {
        "step_us_without": step_us, "step_us_with_check_every_step": statistics.median(on) * 1e6,
        "check_us": check_us, "loop_checks_every_steps": every, "per_step_us": check_us / every,
        "per_step_fraction": check_us / every / step_us,
    }  # fmt: skip
    print(f"step without checks {step_us:.0f} us, with a check every step {result['step_us_with_check_every_step']:.0f} us"
          f" (median of {len(diffs)} paired blocks of {a.block_steps} steps): a check costs {check_us:.1f} us; "
          f"the loop checks every {every} steps of this size: {check_us / every:.2f} us per step "
          f"({100 * result['per_step_fraction']:.3f}%)")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
