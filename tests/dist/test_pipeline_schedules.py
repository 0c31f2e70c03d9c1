"""Every synchronous schedule on 2 real gloo processes gives the gradients of one process on the same batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from disttrain_trainer.parallel.blocks import named_block_params, split_blocks

sys.path.insert(0, str(Path(__file__).parent))
import pipeline_worker as worker  # noqa: E402
from ports import free_port  # tests/ports.py: tests/conftest.py puts tests/ on sys.path

SCHEDULES = ["Naive:mlp", "GPipe:mlp", "1F1B:mlp", "Interleaved1F1B:mlp", "InterleavedZeroBubble:mlp",
             "ZBVZeroBubble:mlp", "1F1B:gpt", "Interleaved1F1B:gpt"]
WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("pipeline-grads")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, worker.__file__, str(r), str(WORLD), str(port), str(tmp / f"r{r}.pt"),
                          ",".join(SCHEDULES)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(WORLD)
    ]  # fmt: skip
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, "\n".join(outs)[-4000:]
    return [torch.load(tmp / f"r{r}.pt") for r in range(WORLD)]


def reference(kind: str) -> tuple[dict[str, torch.Tensor], float]:
    model, x, y = worker.build(kind)
    loss = worker.loss_fn(model(x), y)
    loss.backward()
    blocks = split_blocks(model)
    return {n: p.grad for n, p in named_block_params(blocks, range(len(blocks)))}, float(loss.detach())


@pytest.mark.parametrize("entry", SCHEDULES)
def test_gradients_equal_one_process(results: list[dict], entry: str) -> None:
    ref, ref_loss = reference(entry.split(":")[1])
    seen: set[str] = set()
    for r in range(WORLD):
        for name, g in results[r][entry]["grads"].items():
            torch.testing.assert_close(g, ref[name], atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
            seen.add(name)
    assert seen == set(ref)  # every block's parameters live on exactly one rank
    losses = [results[r][entry]["loss"] for r in range(WORLD) if results[r][entry]["loss"] is not None]
    assert len(losses) == 1 and losses[0] == pytest.approx(ref_loss, abs=1e-5)


def test_one_f_one_b_holds_fewer_activations_than_gpipe(results: list[dict]) -> None:
    # 4 micro-batches, 2 stages: GPipe holds all 4 on the first stage, 1F1B at most 2.
    gpipe, ofob = results[0]["GPipe:mlp"]["peak"], results[0]["1F1B:mlp"]["peak"]
    assert 0 < ofob < gpipe
    assert ofob * 2 == pytest.approx(gpipe, rel=0.01)


def test_every_micro_batch_is_computed_once_per_stage(results: list[dict]) -> None:
    for entry, mbs in (("Naive:mlp", 1), ("GPipe:mlp", 4)):
        kinds = sorted((k, s, m) for r in range(WORLD) for k, s, m, _, _ in results[r][entry]["intervals"])
        assert kinds == sorted((k, s, m) for k in "FB" for s in range(WORLD) for m in range(mbs))
