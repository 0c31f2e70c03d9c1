"""What a repeated batch does to a step, in one process: why `vs_torchrun.py --ablate data` saves more
than the data path costs.

The digits MLP (128 x 2, the trainer's architecture), batch 64, torch's fused SGD, one thread; each
way of getting the next batch trains 3,000 steps after 200 of warm-up, five blocks in turn, and the
median per step is printed:

  trainer     the trainer's data path: the sampler, the shard rows, torch.from_numpy
  trainer-torch  the sampler's rows, gathered by torch from tensors in memory instead of numpy
  plain       a plain loop's: X[perm[a:b]] on tensors in memory
  same        the first batch object again every step (what `--ablate data` does)
  same-copy   a fresh copy of that batch every step: new memory, the same values

    .venv/bin/python benchmarks/repeated_batch.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from disttrain_api.model import parse_spec  # noqa: E402
from disttrain_trainer import data as datasets  # noqa: E402
from torch import nn  # noqa: E402

BATCH, WARMUP, STEPS, BLOCKS = 64, 200, 3000, 5
Batch = tuple[torch.Tensor, torch.Tensor]


def main() -> int:
    torch.set_num_threads(1)
    spec = parse_spec({"mode": "data", "workers": {"replicas": 1}, "model": {"name": "mlp", "hidden": 128, "layers": 2},
                       "data": {"name": "digits", "batchSize": BATCH, "seed": 0}, "training": {"steps": 10}})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ds = datasets.load_dataset(spec, Path(tmp))
        sampler = datasets.GlobalBatchSampler(ds.num_train, BATCH, 0, 0, 1)
        everything = np.arange(ds.num_train)
        x_all, y_all = (torch.from_numpy(np.array(a.take(everything))) for a in (ds.train_x, ds.train_y))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Sequential(nn.Linear(64, 128), nn.ReLU()), nn.Sequential(nn.Linear(128, 128), nn.ReLU()),
                              nn.Linear(128, 10))  # fmt: skip
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)
        perm, at = torch.randperm(ds.num_train), [0]

        def trainer() -> Batch:
            x, y = datasets.next_batch(ds, sampler)
            return torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y))

        def plain() -> Batch:
            at[0] = (at[0] + BATCH) % (ds.num_train - BATCH)
            idx = perm[at[0] : at[0] + BATCH]
            return x_all[idx], y_all[idx]

        def trainer_torch() -> Batch:
            idx = torch.from_numpy(sampler.next_indices())
            return x_all[idx], y_all[idx]

        first = trainer()
        ways: dict[str, Callable[[], Batch]] = {
            "trainer": trainer, "trainer-torch": trainer_torch, "plain": plain, "same": lambda: first,
            "same-copy": lambda: (first[0].clone(), first[1].clone()),
        }  # fmt: skip

        def per_step(batch: Callable[[], Batch]) -> float:
            def step() -> None:
                x, y = batch()
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()

            for _ in range(WARMUP):
                step()
            t = time.perf_counter()
            for _ in range(STEPS):
                step()
            return (time.perf_counter() - t) / STEPS

        got: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(BLOCKS):
            for name, way in ways.items():
                got[name].append(per_step(way))
    print("| batch each step | us per step (median) | blocks |")
    print("| --- | --- | --- |")
    for name, values in got.items():
        print(f"| {name} | {statistics.median(values) * 1e6:.0f} | {', '.join(f'{v * 1e6:.0f}' for v in values)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
