"""Cross-field rules of spec.faultTolerance and spec.training.sync: where fault-tolerant replicas
and LocalSGD / DiLoCo can run, and with what.

A fault-tolerant replica group is one worker pod (torchft's Manager per process, its all-reduce
across the replica groups): one process with ddp, or procsPerWorker processes that shard the model
with fsdp (HSDP: sharded inside the pod, replicated fault-tolerantly across pods). Several
processes of a ddp replica would need an all-reduce inside the pod besides torchft's across pods,
which nothing runs: refused, as are tensor and pipeline parallel (mode data only).
"""

from __future__ import annotations

from .model import JobSpec
from .rule_checker import Checker


def fault_tolerance(spec: JobSpec, c: Checker) -> None:
    ft = spec.fault_tolerance
    if ft is None or not ft.enabled or not c.ok("spec.faultTolerance"):
        return
    if c.ok("spec.mode") and spec.mode != "data":
        c.add("spec.faultTolerance",
              f"only mode data has replicas that can train on without a peer (mode is {spec.mode}); remove "
              "faultTolerance or set spec.mode: data")
        return
    if (c.ok("spec.workers.procsPerWorker", "spec.parallelism.dataStrategy") and spec.workers.procs_per_worker != 1
            and spec.parallelism.data_strategy != "fsdp"):  # fmt: skip
        c.add("spec.workers.procsPerWorker",
              f"must be 1 with faultTolerance and dataStrategy {spec.parallelism.data_strategy} (got "
              f"{spec.workers.procs_per_worker}): a ddp replica is one process; raise workers.replicas instead, or "
              "set dataStrategy: fsdp to shard each replica over its pod's processes (HSDP)")  # fmt: skip
    if c.ok("spec.workers.replicas", "spec.faultTolerance.minReplicas") and ft.min_replicas > spec.workers.replicas:
        c.add("spec.faultTolerance.minReplicas",
              f"{ft.min_replicas} must be <= workers.replicas {spec.workers.replicas}")
    if (c.ok("spec.faultTolerance.quorumIntervalSteps", "spec.training.sync") and ft.quorum_interval_steps is not None
            and spec.training.sync.kind != "every-step"):  # fmt: skip
        c.add("spec.faultTolerance.quorumIntervalSteps",
              f"{ft.quorum_interval_steps} applies to training.sync every-step; with {spec.training.sync.kind} the "
              "replicas ask for a quorum once per training.sync.interval anyway: remove quorumIntervalSteps")
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
    if s.kind == "every-step" and s.every_step_first and c.ok("spec.training.sync"):
        c.add("spec.training.sync.everyStepFirst",
              f"{s.every_step_first} applies to sync kinds localsgd and diloco; every-step all-reduces every step "
              "anyway: remove everyStepFirst")
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
    if c.ok("spec.training.sync.everyStepFirst", "spec.training.sync.interval") and s.every_step_first % s.interval:
        c.add("spec.training.sync.everyStepFirst",
              f"{s.every_step_first} must be a multiple of training.sync.interval {s.interval}: the replicas "
              "synchronise on multiples of the interval, from the first after the every-step steps")
    if c.ok("spec.training.steps", "spec.training.sync.everyStepFirst") and s.every_step_first >= spec.training.steps:
        c.add("spec.training.sync.everyStepFirst",
              f"{s.every_step_first} must be below training.steps {spec.training.steps}: every step would "
              f"all-reduce the gradients (that is sync kind every-step)")
    ft = spec.fault_tolerance
    if (ft is not None and ft.enabled and s.every_step_first and c.ok("spec.faultTolerance")
            and c.ok("spec.training.sync.everyStepFirst")):  # fmt: skip
        c.add("spec.training.sync.everyStepFirst",
              f"{s.every_step_first} is not supported with faultTolerance: fault-tolerant replicas run either "
              "the every-step protocol or the sync protocol for the whole job; train the every-step steps in a "
              "job of their own and start this one from its export (model.init)")
    if c.ok("spec.training.steps", "spec.training.sync.interval") and s.interval > spec.training.steps:
        c.add("spec.training.sync.interval",
              f"{s.interval} exceeds training.steps {spec.training.steps}: the replicas would never synchronise")
