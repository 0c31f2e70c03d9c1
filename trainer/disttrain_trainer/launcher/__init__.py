"""`disttrain local`: run a DistTrainJob's gang of trainer processes on this machine.

The launcher speaks the same env contract as the operator's pods
(`disttrain_api.constants`), so a job that works here works in a cluster.
It imports no torch at module level: only the CUDA probe does, lazily.

Modules: `env` (per-process environment), `gang` (start/watch/kill the
processes), `progress` (tail rank 0's JSON-lines log, render the bar),
`report` (final summary and PNG), `run` (the restart loop tying them together).
"""

from __future__ import annotations

from disttrain_trainer.launcher.run import LocalOptions, LocalResult, run_local

__all__ = ["LocalOptions", "LocalResult", "run_local"]
