"""Models as ordered pipeline blocks: the blocks compose to the model, and the contract's errors."""

from __future__ import annotations

import pytest
import torch
from disttrain_trainer.models import CNN, GPT, MLP
from disttrain_trainer.parallel.blocks import (
    block_state,
    check_chain,
    load_block_state,
    split_blocks,
)
from disttrain_trainer.process.config import ConfigError
from torch import nn


@pytest.mark.parametrize(
    ("model", "x", "n"),
    [
        (MLP(64, 16, 3, 10, 0.0, "none"), torch.randn(5, 64), 4),
        (CNN(8, 4, 3, 10, 0.0, "none"), torch.randn(5, 64), 4),
        (GPT(20, 12, 16, 3, 2, 0.0, "none"), torch.randint(0, 20, (5, 12)), 5),
        (nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(5, 4), 3),
    ],
    ids=["mlp", "cnn", "gpt", "sequential"],
)
def test_blocks_compose_to_the_model(model: nn.Module, x: torch.Tensor, n: int) -> None:
    torch.manual_seed(0)
    blocks = split_blocks(model)
    assert len(blocks) == n
    y = x
    for b in blocks:
        y = b(y)
    torch.testing.assert_close(y, model(x))
    # Every parameter of the model is in exactly one block.
    ids = [id(p) for b in blocks for p in b.parameters()]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())


def test_block_state_round_trip_is_independent_of_the_split() -> None:
    torch.manual_seed(0)
    a = split_blocks(MLP(64, 16, 4, 10, 0.0, "none"))
    torch.manual_seed(1)
    b = split_blocks(MLP(64, 16, 4, 10, 0.0, "none"))
    state = {**block_state(a, [0, 1]), **block_state(a, [2, 3, 4])}
    load_block_state(b, range(5), state)
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x.parameters(), y.parameters(), strict=True):
            assert torch.equal(p, q)


def test_a_model_without_blocks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"pipeline_blocks\(\) method"):
        split_blocks(nn.Linear(2, 2), name="pkg.mod:make")


class _Skips(nn.Module):
    """Blocks that leave a step of forward out (the activation between them)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))

    def pipeline_blocks(self) -> list[nn.Module]:
        return [self.a, self.b]


class _TwoOutputs(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def test_check_chain_names_the_block_that_breaks_the_contract() -> None:
    mlp = MLP(64, 16, 3, 10, 0.1, "none")
    check_chain(mlp, split_blocks(mlp), torch.randn(3, 64))  # the built-ins keep it, dropout or not
    assert mlp.training
    with pytest.raises(ConfigError, match=r"'pkg:m': its pipeline blocks applied in turn do not compute model\(x\)"):
        check_chain(_Skips(), _Skips().pipeline_blocks(), torch.randn(3, 4), name="pkg:m")
    bad = nn.Sequential(nn.Linear(4, 3), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"pipeline block 1 \(Linear\) fails on a tensor of shape \[3, 3\]"):
        check_chain(bad, list(bad), torch.randn(3, 4))
    two = nn.Sequential(_TwoOutputs(), nn.Identity())
    with pytest.raises(ConfigError, match=r"block 0 \(_TwoOutputs\) returns tuple; each block must return one tensor"):
        check_chain(two, list(two), torch.randn(3, 4))
