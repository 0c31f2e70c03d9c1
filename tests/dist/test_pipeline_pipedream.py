"""PipeDream on 2 real gloo processes: the weight-stashing invariant, checked directly.

(Its digits accuracy is checked through the trainer: test_pipeline_trainer.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from disttrain_trainer.parallel.blocks import split_blocks
from torch import nn
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).parent))
import pipedream_worker as worker  # noqa: E402
from ports import free_port  # tests/ports.py: tests/conftest.py puts tests/ on sys.path

WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("pipedream")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, worker.__file__, str(r), str(WORLD), str(port), str(tmp / f"r{r}.pt")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(WORLD)
    ]  # fmt: skip
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, "\n".join(outs)[-4000:]
    return [torch.load(tmp / f"r{r}.pt", weights_only=False) for r in range(WORLD)]


def stage_module(rank: int) -> nn.Module:
    blocks = split_blocks(worker.model())
    from disttrain_trainer.modes.pipeline.partition import uniform_bounds

    a, b = uniform_bounds(len(blocks), WORLD)[rank]
    return nn.Sequential(*blocks[a:b])


def test_backward_uses_the_forward_weight_version(results: list[dict]) -> None:
    first = results[0]["trace"]
    # Stage 0 of 2 keeps 2 micro-batches in flight: from the second one on, its backward runs
    # after the previous micro-batch's update, so the live weights are newer than the forward's.
    assert any(e.backward_version > e.forward_version for e in first)
    assert all(e.backward_version - e.forward_version <= WORLD - 1 for e in first)
    mod = stage_module(0)
    checked = 0
    for e in first:
        if e.backward_version == e.forward_version:
            continue
        # The gradient applied equals the gradient at the forward's (stashed) weights ...
        stash = {n: w.clone().requires_grad_() for n, w in e.stash.items()}
        out = functional_call(mod, stash, (e.inp,))
        torch.autograd.backward(out, e.grad_out)
        for n, w in stash.items():
            torch.testing.assert_close(e.grads[n], w.grad, atol=1e-6, rtol=1e-6)
        # ... and is not the gradient at the weights live when the backward ran .
        assert any(not torch.equal(e.live[n], e.stash[n]) for n in e.live)
        live = {n: w.clone().requires_grad_() for n, w in e.live.items()}
        torch.autograd.backward(functional_call(mod, live, (e.inp,)), e.grad_out)
        assert max(float((e.grads[n] - live[n].grad).abs().max()) for n in live) > 1e-4
        checked += 1
    assert checked >= 2
    # The last stage's forward and backward of a micro-batch are adjacent: one version.
    assert all(e.backward_version == e.forward_version for e in results[1]["trace"])


def test_updates_after_every_micro_batch(results: list[dict]) -> None:
    assert results[0]["version"] == results[1]["version"] == worker.STEPS * worker.MICRO
