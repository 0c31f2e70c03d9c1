"""The job's status (`.status`), written by the operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..dataparse import FieldError, Object, SpecError, Time, fld, json_name, parse_dataclass
from .vocabulary import ConditionStatus, Phase

# Written by the operator (never by users); the CRD serves it through the status
# subresource. Every field is optional there: the operator fills them over time.
# Free-text fields are nullable: a kube-apiserver 1.20 built with Go >= 1.19 (the
# local cluster's) rejects "" in a non-nullable string field as "must be of type
# string: null" (go-openapi compares against reflect.Zero, which Go now shares).


@dataclass(frozen=True, kw_only=True)
class Condition:
    type: str = fld(desc="Condition type, e.g. Created, Running, Restarting, Succeeded, Failed, InvalidSpec.")
    status: ConditionStatus = fld(desc="True, False or Unknown.")
    reason: str | None = fld(None, desc="One CamelCase word saying why.")
    message: str | None = fld(None, desc="Human-readable details.")
    last_transition_time: Time | None = fld(None, desc="When status last changed.")


@dataclass(frozen=True, kw_only=True)
class WorkerCounts:
    active: int = fld(0, minimum=0, desc="Worker pods pending or running.")
    pending: int = fld(0, minimum=0, desc="Worker pods not yet running.")
    succeeded: int = fld(0, minimum=0, desc="Worker pods that exited 0.")
    failed: int = fld(0, minimum=0, desc="Worker pods that failed.")


@dataclass(frozen=True, kw_only=True)
class Progress:
    completed: int = fld(0, minimum=0, desc="Steps (rounds, in federated mode) completed, as rank 0 (the aggregator) reported.")
    total: int = fld(0, minimum=0, desc="Steps (rounds) the job trains: spec.training.steps (spec.federated.rounds).")
    unit: Literal["steps", "rounds"] = fld("steps", desc="What completed and total count: steps, or rounds in federated mode.")
    percent: float = fld(0.0, minimum=0.0, maximum=100.0, desc="completed / total, in percent.")
    rate: float | None = fld(
        None, minimum=0.0,
        desc="Recent steps (rounds) per second: the rates measured between updates, each weighted by its "
        "window's length halved every 30 s since (about the mean over a short run; the last minute or so "
        "of a long one).",
    )
    rate_seconds: float | None = fld(
        None, minimum=0.0,
        desc="The weight of the rate: seconds of progress it was measured over, each halved every 30 s since.",
    )
    samples_per_second: float | None = fld(
        None, minimum=0.0, desc="Recent samples per second of the whole job (rate x data.batchSize); not in federated mode."
    )
    tokens_per_second: float | None = fld(
        None, minimum=0.0, desc="Recent tokens per second (samples x model.blockSize), for a language model."
    )
    mfu: float | None = fld(
        None, minimum=0.0,
        desc="Model FLOPs utilisation, where the trainer knows the accelerators' peak (a GPT on a known GPU).",
    )
    eta_seconds: int | None = fld(
        None, minimum=0,
        desc="Seconds left: the steps left at the recent rate, plus what the run takes after its last step "
        "(final evaluation, export, final checkpoint) as rank 0 measured their costs.",
    )
    eta: str | None = fld(None, desc="etaSeconds for people, e.g. 12m05s.")
    last_update_time: Time | None = fld(None, desc="When these figures were measured.")


@dataclass(frozen=True, kw_only=True)
class JobSecrets:
    identity: str | None = fld(
        None,
        desc="The Secret with the server key and every identity's credential that the operator created for "
        "this job (federated, paramserver); the only one the pods mount for it. Named <job>-identity-<random>, "
        "recorded here once the API server accepted its creation, so a Secret someone created under a name "
        "they could predict is never mounted.",
    )
    tls: str | None = fld(
        None, desc="The TLS Secret the operator created (none with tls: false or a tlsSecretName), recorded the same way."
    )
    tls_not_after: Time | None = fld(
        None,
        desc="When the certificate in tls expires. The operator creates a new one before (its "
        "--tls-renew-before ahead) and restarts the gang and its servers on it.",
    )


@dataclass(frozen=True, kw_only=True)
class ReplicaGroups:
    healthy: int = fld(0, minimum=0, desc="Replica pods running and not failed (spec.faultTolerance).")
    quorum: int = fld(
        0, minimum=0,
        desc="Replicas in the quorum of the latest step, as a replica reported it: smaller than healthy while a "
        "replacement is still joining, smaller than spec.workers.replicas while a failed replica is missing.",
    )
    quorum_id: int | None = fld(None, minimum=0, desc="The lighthouse's id of that quorum; it changes with every membership change.")
    lost: int = fld(0, minimum=0, desc="Replicas lost (failed or deleted) and replaced alone so far.")
    joined: int = fld(0, minimum=0, desc="Times the quorum grew back, a replacement having joined and recovered from a peer.")


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    phase: Phase = fld("Pending", desc="Pending, Running, Restarting, Succeeded, Failed or Suspended.")
    conditions: tuple[Condition, ...] = fld((), desc="Kubernetes-style conditions, one per type.")
    workers: WorkerCounts = fld(factory=WorkerCounts, desc="Worker pods by state.")
    replicas: int = fld(0, minimum=0, desc="Current gang size in pods (smaller than spec with elastic shrinking).")
    replica_groups: ReplicaGroups | None = fld(
        None,
        desc="With spec.faultTolerance: the replicas (worker pods) that are healthy and those in the quorum "
        "that trains (status.replicas is the gang size).",
    )
    restarts: int = fld(
        0, minimum=0,
        desc="Failures counted against runPolicy.backoffLimit so far: gang restarts, and pods replaced alone "
        "(parameter-server workers, federated clients, fault-tolerant replicas).",
    )
    disruptions: int = fld(
        0, minimum=0,
        desc="Pods ended by a disruption (eviction, drain, preemption, deletion by someone other than the "
        "operator, a trainer stopped because its pod was being deleted): the gang restarts (federated, "
        "paramserver, fault-tolerant replicas: the pod is replaced) without counting against "
        "runPolicy.backoffLimit.",
    )
    counted_pods: Object = fld(
        factory=Object,
        desc="Live pods whose end is counted already in restarts or disruptions, UID: name (federated, "
        "paramserver and fault-tolerant replicas replace pods one by one); the operator's bookkeeping.",
    )
    attempt: int = fld(
        0,
        minimum=0,
        desc="Gang generation: bumps on every gang re-creation (failure restart, elastic resize, resume); "
        "pods carry it as label disttrain.dev/restart-attempt and env DISTTRAIN_RESTART_ATTEMPT.",
    )
    last_spec_replicas: int = fld(
        0,
        minimum=0,
        desc="spec.workers.replicas the operator last applied; a change of it resizes the gang within spec.elastic.",
    )
    step: int = fld(0, minimum=0, desc="Latest training step reported by rank 0.")
    comm_fraction: float | None = fld(
        None,
        minimum=0.0,
        json="commFraction",
        desc="Rank 0's communication seconds / step seconds since its start (the trainer's summary when finished).",
    )
    last_checkpoint_step: int = fld(0, minimum=0, desc="Step of the newest complete checkpoint.")
    progress: Progress | None = fld(
        None,
        desc="How far the job got and when it will finish at its recent rate; written at most every 10 s "
        "while it runs (disttrain_api/progress.py).",
    )
    hint: str | None = fld(
        None,
        desc="When the job's step waits on communication for a quarter or more (rank 0's last log interval "
        "while it runs, the whole run once it finished): the change the scaling forecast (`disttrain explain`) "
        "predicts helps most at its size, and by how much; gone once the share falls below a fifth.",
    )
    hint_announced: str | None = fld(
        None,
        desc="The change the job's last ScalingHint Event proposed (e.g. dp8 powersgd): a hint that comes back "
        "with the same change after it went is written to status.hint again without another Event.",
    )
    start_time: Time | None = fld(None, desc="When the first gang was created.")
    completion_time: Time | None = fld(None, desc="When the job succeeded or failed.")
    observed_generation: int = fld(0, minimum=0, desc="metadata.generation this status reflects.")
    message: str | None = fld(None, desc="Human-readable summary of the current phase.")
    result: Object = fld(
        factory=Object, desc="The trainer's final summary (e.g. testAccuracy, finalLoss, resumedFromStep, wallS)."
    )
    secrets: JobSecrets | None = fld(None, desc="Names (never contents) of the Secrets the operator created for the job.")
    kopf: Object = fld(factory=Object, desc="Handler progress kept by the kopf framework; not an API.")


def parse_status(data: Any) -> JobStatus:
    """Parse `.status` as the operator wrote it. Lenient: unknown keys are ignored,
    because kopf may keep its own keys there (e.g. handler results)."""
    known = {json_name(f) for f in JobStatus.__dataclass_fields__.values()}
    data = {k: v for k, v in (data or {}).items() if k in known} if isinstance(data, dict) else {}
    errors: list[FieldError] = []
    status = parse_dataclass(JobStatus, data, "status", errors)
    if errors:
        raise SpecError(errors)
    return status
