"""A model of steady speed on a shared host, for tests that time a job: every forward sleeps
STEP_SLEEP_S before one small linear layer, so a training step and each batch of the final
evaluation take about that wall time whatever else the host's two cores are doing (the compute
left is well under a millisecond). `model.name: steady_model:factory`, with this folder on
PYTHONPATH."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

STEP_SLEEP_S = 0.03


class Steady(nn.Module):
    def __init__(self, inputs: int, classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(STEP_SLEEP_S)
        return self.head(x)


def factory(spec: Any, dataset: Any) -> nn.Module:
    return Steady(dataset.input_dim, dataset.num_classes)
