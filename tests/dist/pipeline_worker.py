"""One rank of a pipeline-gradient check: every schedule on one batch, gradients saved per schedule.

Run by test_pipeline_schedules.py as `python pipeline_worker.py RANK WORLD PORT OUT SCHEDULES`; a plain
script (not a test module) because each rank is its own process on a real gloo group.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from disttrain_trainer.models import GPT, MLP
from disttrain_trainer.modes.pipeline.partition import Plan, uniform_bounds
from disttrain_trainer.modes.pipeline.schedules import Pipeline, total_stages
from disttrain_trainer.parallel.blocks import named_block_params, split_blocks

MICROBATCHES = 4
BATCH = 16


def build(kind: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if kind == "mlp":
        model = MLP(64, 32, 8, 10, 0.0, "none")
        g = torch.Generator().manual_seed(1)
        return model, torch.randn(BATCH, 64, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    model = GPT(20, 12, 16, 6, 2, 0.0, "none")
    g = torch.Generator().manual_seed(1)
    return model, torch.randint(0, 20, (BATCH, 12), generator=g), torch.randint(0, 20, (BATCH, 12), generator=g)


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    schedules = sys.argv[5].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    result = {}
    for entry in schedules:
        schedule, kind = entry.split(":")
        model, x, y = build(kind)
        blocks = split_blocks(model)
        virtual = 2 if schedule in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble") else 1
        n = total_stages(schedule, world, virtual)
        bounds = uniform_bounds(len(blocks), n)
        plan = Plan(method="uniform", bounds=bounds, stage_seconds=tuple(0.0 for _ in bounds))
        pipe = Pipeline(blocks, plan, schedule=schedule, microbatches=MICROBATCHES, virtual=virtual,
                        pp_rank=rank, pp_size=world, group=None, device=torch.device("cpu"), loss_fn=loss_fn)
        res = pipe.step(x, y)
        grads = {name: p.grad.clone() for name, p in named_block_params(blocks, pipe.block_ids)}
        result[entry] = {"grads": grads, "loss": None if res.loss is None else float(res.loss), "peak": res.act_peak_bytes,
                         "intervals": res.intervals}
        dist.barrier()
    torch.save(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
