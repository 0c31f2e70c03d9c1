"""What the job's layout asks of its model, checked on every rank as soon as the model is built.

A pipeline needs the model's ordered blocks (blocks.split_blocks), tensor parallelism its plan
(tensor.plan_for; with a pipeline, one plan per block) and what must split evenly over the
tensor-parallel ranks (tensor.check_divisible). The modes call the same functions again where they
cut and shard the model, after their collectives have begun (the link probe, the device mesh's
groups). Checked there alone, the rank that got there first failed with its ConfigError and
exited, and a peer still creating a group through that rank's store failed with a broken pipe
(exit 1, not 2). Checked here, before any collective after the model's build, every rank fails
alike with the same message.
"""

from __future__ import annotations

from disttrain_api.model import JobSpec
from torch import nn

from .blocks import split_blocks


def check_model_contract(spec: JobSpec, model: nn.Module) -> None:
    """Raise the ConfigError the layout's build would raise for `model`; nothing when it fits."""
    par = spec.parallelism
    if par.pipeline > 1:
        split_blocks(model, name=spec.model.name)
    if par.tensor > 1:
        from . import tensor  # noqa: PLC0415 - DTensor's parallel styles, only for a tensor-parallel job

        tensor.check_divisible(model, par.tensor)
        if par.pipeline > 1:
            tensor.block_plans(model, sequence_parallel=par.sequence_parallel)
        else:
            tensor.plan_for(model, sequence_parallel=par.sequence_parallel)
