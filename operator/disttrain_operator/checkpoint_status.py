"""What a job's status says about where its checkpoints live (pure, part of decide()).

- `CheckpointsEphemeral`: spec.checkpoint.volume is an emptyDir (or a generic ephemeral
  volume), asked for explicitly: checkpoints die with the pod and a restarted gang starts from
  step 0. A Warning Event when it turns True; False again once the spec names another volume.
- While the gang waits for the job's own checkpoint claim to be bound, the phase message says
  so (the scheduler's "unbound immediate PersistentVolumeClaims" is then no reason to call the
  pods Unschedulable, nor to shrink an elastic gang). A claim still Pending after the operator's
  `claim_pending_after_s` gets `CheckpointClaimPending` (a Warning Event) naming the likely
  causes: no default StorageClass, or a class that offers only ReadWriteOnce where the job's
  pods on several nodes need ReadWriteMany. Bound clears it.
"""

from __future__ import annotations

from disttrain_api import checkpoint_storage as storage
from disttrain_api.model import JobSpec

from .decision import CHECKPOINT_CLAIM_PENDING, CHECKPOINTS_EPHEMERAL, Observed, StatusBuilder
from .observe import ClaimView


def ephemeral_condition(b: StatusBuilder, spec: JobSpec) -> None:
    kind = storage.ephemeral_source(spec)
    if kind is not None:
        b.condition(CHECKPOINTS_EPHEMERAL, True, "EphemeralVolume",
                    f"checkpoints are on spec.checkpoint.volume.{kind}: {storage.ephemeral_message(kind)}")
    else:  # only updates a condition set before (absent == False)
        b.condition(CHECKPOINTS_EPHEMERAL, False, "PersistentVolume", "checkpoints are on a volume that outlives the pods")


def pending_message(claim: ClaimView, after_s: float) -> str:
    cls = f"StorageClass {claim.storage_class}" if claim.storage_class else "the cluster's default StorageClass"
    modes = ", ".join(claim.access_modes) or "no access mode"
    why = ("no StorageClass is the cluster's default" if not claim.storage_class
           else f"StorageClass {claim.storage_class} does not exist or has no working provisioner")
    if "ReadWriteMany" in claim.access_modes:
        why += (", or the class offers only ReadWriteOnce (most block storage), while the job's pods on different "
                "nodes share the volume")
        fix = "a StorageClass that offers ReadWriteMany (NFS, CephFS, EFS, Filestore, Azure Files)"
    else:
        fix = "a StorageClass with a working provisioner"
    return (f"PersistentVolumeClaim {claim.name} (checkpoints: {modes}, {claim.size or 'no size'}, {cls}) has been "
            f"Pending for more than {after_s:.0f}s: no volume was provisioned or bound for it. Likely {why}. Set the "
            f"operator's checkpoint StorageClass (Helm: checkpoints.storageClass) to {fix}, or name a claim of your "
            f"own in spec.checkpoint.volume; `kubectl describe pvc {claim.name}` shows the provisioner's reason")


def claim_wait(b: StatusBuilder, obs: Observed) -> str | None:
    """The phase message while the gang waits for the job's checkpoint claim, else None."""
    claim = obs.claim
    if claim is None:
        return None
    if claim.phase == "Bound":
        b.condition(CHECKPOINT_CLAIM_PENDING, False, "ClaimBound", f"PersistentVolumeClaim {claim.name} is bound")
        return None
    if claim.phase == "Lost":
        msg = (f"PersistentVolumeClaim {claim.name} (checkpoints) lost its volume (the PersistentVolume is gone): "
               "restore the volume, or delete the job and the claim and start again")
        b.condition(CHECKPOINT_CLAIM_PENDING, True, "ClaimLost", msg)
        return msg
    if claim.age_s < obs.claim_pending_after_s:
        return f"waiting for PersistentVolumeClaim {claim.name} (checkpoints) to be bound"
    msg = pending_message(claim, obs.claim_pending_after_s)
    b.condition(CHECKPOINT_CLAIM_PENDING, True, "ClaimPending", msg)
    return msg


def claim_waits(obs: Observed) -> bool:
    """Whether the clock alone can change the claim's verdict (needs_recheck)."""
    return obs.claim is not None and obs.claim.phase == "Pending"
