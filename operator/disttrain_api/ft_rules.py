"""Cross-field rules of spec.faultTolerance and spec.training.sync: where fault-tolerant replicas
and LocalSGD / DiLoCo can run, and with what.

A fault-tolerant replica group is one worker pod running one process (torchft's Manager per
replica, its all-reduce across replicas): layouts that spread a replica over several processes
(procsPerWorker > 1, FSDP, tensor or pipeline parallel) are refused with the reason.
"""

from __future__ import annotations

from .model import JobSpec
from .rule_checker import Checker

# Why FSDP (HSDP: sharded inside a replica group, replicated across them) is refused with
# faultTolerance; README "Fault tolerance" says the same.
FSDP_REASON = (
    "fsdp (HSDP with a fault-tolerant replicated dimension) is not supported with faultTolerance: a replica "
    "group here is one process, and torchft 0.2.0 has no device mesh for a sharded group (its "
    "ManagedDeviceMesh was removed, meta-pytorch/torchft#289, as it relied on DeviceMesh's private API); "
    "use dataStrategy ddp, or turn faultTolerance off"
)


def fault_tolerance(spec: JobSpec, c: Checker) -> None:
    ft = spec.fault_tolerance
    if ft is None or not ft.enabled or not c.ok("spec.faultTolerance"):
        return
    if c.ok("spec.mode") and spec.mode != "data":
        c.add("spec.faultTolerance",
              f"only mode data has replicas that can train on without a peer (mode is {spec.mode}); remove "
              "faultTolerance or set spec.mode: data")
        return
    if c.ok("spec.parallelism.dataStrategy") and spec.parallelism.data_strategy == "fsdp":
        c.add("spec.parallelism.dataStrategy", FSDP_REASON)
    if c.ok("spec.workers.procsPerWorker") and spec.workers.procs_per_worker != 1:
        c.add("spec.workers.procsPerWorker",
              f"must be 1 with faultTolerance (got {spec.workers.procs_per_worker}): each worker pod is one "
              "replica of one process; raise workers.replicas instead")
    if c.ok("spec.workers.replicas", "spec.faultTolerance.minReplicas") and ft.min_replicas > spec.workers.replicas:
        c.add("spec.faultTolerance.minReplicas",
              f"{ft.min_replicas} must be <= workers.replicas {spec.workers.replicas}")
    if spec.elastic is not None and c.ok("spec.elastic"):
        c.add("spec.elastic",
              "cannot be combined with faultTolerance: fault-tolerant replicas already go on at a smaller "
              "quorum and are replaced one by one; remove one of them")
    if c.ok("spec.training.gradientCompression") and spec.training.gradient_compression != "none":
        c.add("spec.training.gradientCompression",
              f"{spec.training.gradient_compression} is a DDP communication hook; with faultTolerance the "
              "all-reduce is the fault-tolerant one: set gradientCompression: none")


def sync(spec: JobSpec, c: Checker) -> None:
    s = spec.training.sync
    if s.kind == "every-step" or not c.ok("spec.training.sync"):
        return
    if c.ok("spec.mode") and spec.mode != "data":
        c.add("spec.training.sync.kind",
              f"{s.kind} averages whole replicas; mode {spec.mode} has none to average (use mode data)")
        return
    if c.ok("spec.parallelism.dataStrategy") and spec.parallelism.data_strategy != "ddp":
        c.add("spec.training.sync.kind",
              f"{s.kind} averages whole replicas; dataStrategy {spec.parallelism.data_strategy} shards them (use ddp)")
    if c.ok("spec.training.gradientCompression") and spec.training.gradient_compression != "none":
        c.add("spec.training.gradientCompression",
              f"{spec.training.gradient_compression} compresses every step's gradients; with sync.kind "
              f"{s.kind} no gradient is all-reduced: set gradientCompression: none")
    if c.ok("spec.checkpoint.intervalSteps", "spec.training.sync.interval") and spec.checkpoint.interval_steps % s.interval:
        c.add("spec.checkpoint.intervalSteps",
              f"{spec.checkpoint.interval_steps} must be a multiple of training.sync.interval {s.interval}: a "
              "checkpoint between two syncs would hold one replica's weights, not the replicas' common model")
    if c.ok("spec.training.steps", "spec.training.sync.interval") and s.interval > spec.training.steps:
        c.add("spec.training.sync.interval",
              f"{s.interval} exceeds training.steps {spec.training.steps}: the replicas would never synchronise")
