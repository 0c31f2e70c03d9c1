"""What every trainer rank imports before its first step, whatever its mode.

A process that starts several ranks imports these once in a forkserver and forks each rank from it
(`disttrain local`'s launcher for a gang, a pod's first process for its local ranks): torch alone
is seconds of CPU per process, and DDP's constructor imports torch._dynamo (over a second more).
A mode's own loop is imported by the rank: a shared service names no mode.
"""

from __future__ import annotations

TRAINER_MODULE = "disttrain_trainer"
PRELOAD = ("torch", "torch._dynamo", f"{TRAINER_MODULE}.__main__")
