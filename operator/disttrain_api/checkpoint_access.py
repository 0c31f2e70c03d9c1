"""Which pods of a job write its checkpoints (or its export), and so get write access to them.

The operator mounts the checkpoint volume read-write and hands spec.objectStore.credentialsSecret
only to these pods; every other pod (federated clients, parameter-server workers but the first,
which exports the model, a fault-tolerant job's lighthouse) mounts the volume read-only and gets
spec.objectStore.dataCredentialsSecret instead. The trainer asks the same question before it
attaches spec.checkpoint.uri, so the two never disagree: a pod that does not write never needs, nor
gets, the checkpoint credentials.
"""

from __future__ import annotations

from . import constants as C


def writes_checkpoints(mode: str, role: str, index: int) -> bool:
    """Whether pod `index` of `role` in a job of `mode` writes checkpoints or the export."""
    if role == C.ROLE_LIGHTHOUSE:
        return False  # the fault-tolerant quorum's server: no model, no state
    if mode == "federated":
        return role == C.ROLE_AGGREGATOR  # clients keep no state; the aggregator exports
    if mode == "paramserver":
        # Shards checkpoint their parameters; worker 0 writes the export (its last pull is the model).
        return role == C.ROLE_SERVER or (role == C.ROLE_WORKER and index == 0)
    return True  # collective modes: every rank writes its shards of a sharded checkpoint
