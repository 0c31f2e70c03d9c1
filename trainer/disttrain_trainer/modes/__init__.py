"""The trainer's modes, one package each, behind one entry: `main(cfg) -> Summary | None`.

    data/         mode data (DDP or FSDP), tensor, and hybrid without a pipeline: layouts
                  of one data-parallel loop over parallel/'s building blocks
    pipeline/     mode pipeline, and hybrid with pipeline > 1 (data x pipeline x tensor)
    federated/    the aggregator and the client processes (gRPC)
    paramserver/  the server shards and the asynchronous workers (gRPC)

`python -m disttrain_trainer` parses the config once and calls `entry_for(spec)(cfg)`. Only the
chosen mode's package is imported: a federated client never loads the data loop's
torch.distributed machinery. A mode returns its summary (None in a process that does not own
one) after writing what the run leaves behind (run_common.py). Modes never import each other;
what they share lives outside this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from disttrain_api.model import JobSpec

from ..process.config import ModeNotImplemented, TrainerConfig

# What every mode's entry is: cfg -> its summary (run_common.Summary), None in a process without one.
ModeEntry = Callable[[TrainerConfig], dict[str, Any] | None]

# The package of each loop and its entry, "module:function" under this package.
ENTRIES = {
    "data": "data.entry:main",
    "pipeline": "pipeline.entry:main",
    "federated": "federated.entry:main",
    "paramserver": "paramserver.entry:main",
}
# spec.mode -> loop; hybrid runs the pipeline loop when it has a pipeline (`loop_of`).
LOOPS = {
    "data": "data",
    "tensor": "data",
    "hybrid": "data",
    "pipeline": "pipeline",
    "federated": "federated",
    "paramserver": "paramserver",
}


def loop_of(spec: JobSpec) -> str:
    """The mode package that runs `spec`."""
    if spec.mode == "hybrid" and spec.parallelism.pipeline > 1:
        return "pipeline"
    if spec.mode not in LOOPS:
        raise ModeNotImplemented(spec.mode, implemented=tuple(LOOPS))
    return LOOPS[spec.mode]


def entry_for(spec: JobSpec) -> ModeEntry:
    """The entry of the mode that runs `spec`, its package imported now."""
    module, func = ENTRIES[loop_of(spec)].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)
