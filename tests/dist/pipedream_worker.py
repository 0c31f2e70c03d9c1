"""One rank of the PipeDream checks: a few steps of an MLP on digits in 2 stages, recording the stashing trace.

Run by test_pipeline_pipedream.py as `python pipedream_worker.py RANK WORLD PORT OUT`.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from disttrain_trainer.models import MLP
from disttrain_trainer.modes.pipeline.partition import uniform_bounds
from disttrain_trainer.modes.pipeline.pipedream import PipeDreamStage
from disttrain_trainer.parallel.blocks import block_state, split_blocks
from sklearn.datasets import load_digits
from torch import nn

STEPS, BATCH, MICRO, TRACE_STEPS = 10, 64, 4, 2


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def model() -> nn.Module:
    torch.manual_seed(0)
    return MLP(64, 64, 3, 10, 0.0, "none")


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    blocks = split_blocks(model())
    a, b = uniform_bounds(len(blocks), world)[rank]
    mod = nn.Sequential(*blocks[a:b])
    opt = torch.optim.SGD(mod.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / STEPS)  # settles the final weights
    stage = PipeDreamStage(module=mod, stage=rank, stages=world, optimizer=opt, loss_fn=F.cross_entropy,
                           device=torch.device("cpu"), trace=[])
    xtr, ytr, _, _ = data()
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(STEPS):
        idx = torch.randint(0, len(xtr), (BATCH,), generator=g)
        res = stage.step(list(xtr[idx].chunk(MICRO)), list(ytr[idx].chunk(MICRO)), MICRO)
        sched.step()
        if step == TRACE_STEPS - 1:
            trace, stage.trace = stage.trace, None
        losses.append(None if res.loss is None else float(res.loss))
    torch.save({"state": block_state(blocks, range(a, b)), "trace": trace, "losses": losses,
                "peak": res.act_peak_bytes, "intervals": res.intervals, "version": stage.version}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
