"""The PersistentVolumeClaim the operator creates for a job's checkpoints when the spec names no
volume (disttrain_api/checkpoint_storage.py decides; the pods mount it through its volume_source).

The claim `<job>-checkpoints` is one per job, shared by every pod that mounts checkpoints and
by every restart attempt, so a restarted gang finds the checkpoints of the one before. It is
owned by the job (the garbage collector deletes it with the job) unless `checkpoint.retain`;
a retained claim has no owner, keeps the job's label, and is reused by the next job of that
name (creation.py). Its StorageClass is the operator's setting (the Helm chart's
`checkpoints.storageClass`), else the cluster's default.
"""

from __future__ import annotations

from typing import Any

from disttrain_api import checkpoint_storage as storage
from disttrain_api import constants as c
from disttrain_api.model import JobSpec

from . import common
from .common import BuildContext

KIND = "PersistentVolumeClaim"


def build_claim(spec: JobSpec, ctx: BuildContext) -> dict[str, Any] | None:
    """The job's checkpoint claim, or None when the spec names a volume or an object store."""
    if not storage.uses_default_claim(spec):
        return None
    meta = common.metadata(ctx, storage.claim_name(ctx.name), common.job_labels(ctx.name))
    if spec.checkpoint.retain:
        meta.pop("ownerReferences", None)  # outlives the job: the garbage collector leaves it
    body: dict[str, Any] = {
        "accessModes": storage.access_modes(spec),
        "resources": {"requests": {"storage": storage.claim_size(spec)}},
    }
    if ctx.checkpoint_storage_class:
        body["storageClassName"] = ctx.checkpoint_storage_class
    return {"apiVersion": "v1", "kind": KIND, "metadata": meta, "spec": body}


def retained_by(claim: dict[str, Any], job: str) -> bool:
    """A claim that an earlier job of this name kept (retain): no controller, the job's label."""
    meta = claim.get("metadata") or {}
    owned = any(ref.get("controller") for ref in meta.get("ownerReferences") or [])
    return claim.get("kind") == KIND and not owned and (meta.get("labels") or {}).get(c.LABEL_JOB) == job

