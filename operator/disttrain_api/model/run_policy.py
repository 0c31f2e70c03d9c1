"""spec.runPolicy: restarts, deadlines, clean-up, suspension and the grace period of a stop."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import fld
from .vocabulary import CleanPodPolicy


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    backoff_limit: int = fld(3, minimum=0, desc="Failures before the job fails: gang restarts, and pods replaced alone "
                             "(parameter-server workers, federated clients, fault-tolerant replicas).")
    active_deadline_seconds: int | None = fld(None, minimum=1, desc="Fail the job after this long running.")
    ttl_seconds_after_finished: int | None = fld(None, minimum=0, desc="Delete the finished job after this long.")
    clean_pod_policy: CleanPodPolicy = fld("Running", desc="Pods deleted when the job finishes.")
    suspend: bool = fld(False, desc="Delete the pods, keep checkpoints; false resumes.")
    termination_grace_period_seconds: int = fld(
        30, minimum=1,
        desc="The pods' terminationGracePeriodSeconds: on SIGTERM (suspend, drain, eviction, preemption) the "
        "trainer finishes its step, checkpoints it and exits within this; the kubelet kills it after "
        "(the previous checkpoint is then used).",
    )
    child_rejected_timeout_seconds: int = fld(
        300, minimum=0,
        desc="How long the operator retries (with backoff) a pod, Service, ConfigMap, Secret or Deployment that "
        "the API server rejects (e.g. 422 Invalid, 403 Forbidden by a quota or an admission policy) before the "
        "job fails with reason ChildRejected.",
    )
