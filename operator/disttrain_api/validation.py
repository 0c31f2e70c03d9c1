"""Cross-field rules of a DistTrainJob: what an OpenAPI schema cannot express.

`api.py` checks each field on its own (types, ranges, enums, patterns); this
module checks how fields fit together — degrees against the world size, batch
splits, mode-specific blocks, model shapes. Every error names the field path to
change and says what is wrong with the numbers involved, and all of them are
reported at once. The CLI (`disttrain validate`) and the operator (which turns
them into an `InvalidSpec` condition) share `check_job` / `load_job`.

A rule whose inputs already failed schema parsing is skipped: its numbers would
be the defaults that replaced the wrong values, not what the user wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from disttrain_api import pod_rules
from disttrain_api.model import (
    ROBUST_STRATEGIES,
    DistTrainJob,
    FederatedSpec,
    FieldError,
    JobSpec,
    SpecError,
    parse_job_partial,
)

# Modes whose workers each hold a whole model replica.
REPLICA_MODES = ("data", "federated", "paramserver")
# Schedules that keep at most `stages` micro-batches in flight per stage, so a
# step with fewer micro-batches than stages never reaches the steady state.
SCHEDULES_NEED_MICROBATCHES = ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
# Schedules that place several (virtual) stages on each rank.
INTERLEAVED_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
LANGUAGE_DATA = ("pytext", "synthetic")
IMAGE_DATA = ("digits", "synthetic")


class _Checker:
    """Collects errors; `ok(...)` says whether a rule's inputs parsed cleanly."""

    def __init__(self, skip: Iterable[FieldError]):
        self.bad = {e.path for e in skip}
        self.errors: list[FieldError] = []

    def ok(self, *paths: str) -> bool:
        for path in paths:
            for bad in self.bad:
                if path == bad or path.startswith(bad + ".") or bad == "(document)":
                    return False
        return True

    def add(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))


def _world(spec: JobSpec) -> str:
    w = spec.workers
    return f"the world size {spec.world_size} (workers.replicas {w.replicas} x procsPerWorker {w.procs_per_worker})"


def _degrees(spec: JobSpec, c: _Checker) -> bool:
    """tensor x pipeline x data == world size. Returns whether the degrees fit."""
    if not c.ok("spec.workers.replicas", "spec.workers.procsPerWorker", "spec.parallelism.tensor", "spec.parallelism.pipeline"):
        return False
    world, tp, pp = spec.world_size, spec.parallelism.tensor, spec.parallelism.pipeline
    fits = True
    if world % tp:
        c.add("spec.parallelism.tensor", f"{tp} does not divide {_world(spec)}")
        fits = False
    if world % pp:
        c.add("spec.parallelism.pipeline", f"{pp} does not divide {_world(spec)}")
        fits = False
    if fits and world % (tp * pp):
        c.add(
            "spec.parallelism.pipeline",
            f"tensor {tp} x pipeline {pp} = {tp * pp} does not divide {_world(spec)}",
        )
        fits = False
    return fits


def _mode_degrees(spec: JobSpec, c: _Checker, degrees_fit: bool) -> None:
    if not c.ok("spec.mode", "spec.parallelism.tensor", "spec.parallelism.pipeline"):
        return
    mode, tp, pp = spec.mode, spec.parallelism.tensor, spec.parallelism.pipeline
    if mode in REPLICA_MODES or mode == "pipeline":
        if tp != 1:
            c.add("spec.parallelism.tensor", f"must be 1 in mode {mode} (got {tp}); tensor parallelism needs mode tensor or hybrid")
    if mode in REPLICA_MODES or mode == "tensor":
        if pp != 1:
            c.add(
                "spec.parallelism.pipeline",
                f"must be 1 in mode {mode} (got {pp}); pipeline parallelism needs mode pipeline or hybrid",
            )
    if mode == "pipeline" and pp < 2:
        c.add("spec.parallelism.pipeline", f"must be > 1 in mode pipeline (got {pp}): set the number of stages")
    if mode == "tensor" and tp < 2:
        c.add("spec.parallelism.tensor", f"must be > 1 in mode tensor (got {tp}): set the tensor-parallel degree")
    if mode == "hybrid" and degrees_fit:
        dp = spec.data_degree
        if sum(d > 1 for d in (tp, pp, dp)) < 2:
            c.add(
                "spec.parallelism",
                f"mode hybrid needs at least two of the tensor ({tp}), pipeline ({pp}) and data ({dp}) degrees > 1; "
                "for one kind of parallelism use mode tensor, pipeline or data",
            )
        elif tp > 1 and pp > 1 and c.ok("spec.parallelism.schedule") and spec.parallelism.schedule == "PipeDream":
            # PipeDream's asynchronous stages keep weight versions of whole tensors.
            c.add(
                "spec.parallelism.schedule",
                f"PipeDream runs with parallelism.tensor 1 (got {tp}); use a synchronous schedule with tensor parallelism",
            )


def _strategies(spec: JobSpec, c: _Checker) -> None:
    par = spec.parallelism
    if c.ok("spec.mode", "spec.parallelism.dataStrategy") and par.data_strategy == "fsdp":
        if spec.mode not in ("data", "hybrid"):
            c.add(
                "spec.parallelism.dataStrategy",
                f"fsdp shards over the data dimension; mode {spec.mode} has none (use mode data or hybrid)",
            )
        elif c.ok("spec.parallelism.pipeline") and par.pipeline > 1:
            # Pipeline stages average whole-stage gradients over the replicas themselves.
            c.add(
                "spec.parallelism.dataStrategy",
                f"fsdp is not supported with parallelism.pipeline {par.pipeline} (stages keep whole replicas); "
                "use ddp, or pipeline 1",
            )
    if c.ok("spec.parallelism.sequenceParallel", "spec.parallelism.tensor") and par.sequence_parallel:
        if par.tensor < 2:
            c.add("spec.parallelism.sequenceParallel", "needs parallelism.tensor > 1 (it splits the tensor-parallel regions' sequence)")
        elif c.ok("spec.model.blockSize") and spec.model.block_size % par.tensor:
            c.add(
                "spec.parallelism.sequenceParallel",
                f"model.blockSize {spec.model.block_size} is not divisible by parallelism.tensor {par.tensor}",
            )


def _schedule(spec: JobSpec, c: _Checker) -> None:
    par = spec.parallelism
    if not c.ok("spec.parallelism.schedule", "spec.parallelism.microbatches", "spec.parallelism.pipeline"):
        return
    if par.pipeline > 1 and par.schedule in SCHEDULES_NEED_MICROBATCHES and par.microbatches < par.pipeline:
        c.add(
            "spec.parallelism.microbatches",
            f"schedule {par.schedule} needs microbatches >= pipeline stages: {par.microbatches} < {par.pipeline} "
            "(parallelism.pipeline)",
        )
    if not c.ok("spec.parallelism.virtualStages"):
        return
    v = par.virtual_stages
    if par.schedule in INTERLEAVED_SCHEDULES:
        if par.schedule == "ZBVZeroBubble" and v != 2:
            c.add("spec.parallelism.virtualStages", f"schedule ZBVZeroBubble places exactly 2 stages per rank (got {v})")
        elif v < 2:
            c.add("spec.parallelism.virtualStages",
                  f"schedule {par.schedule} needs >= 2 stages per rank (got {v}); for 1 use schedule 1F1B")
        # torch runs these schedules in rounds of `pipeline` micro-batches.
        rounds = max(1, par.microbatches // par.pipeline)
        if par.pipeline > 1 and par.microbatches % rounds:
            c.add("spec.parallelism.microbatches",
                  f"schedule {par.schedule} runs rounds of parallelism.pipeline {par.pipeline} micro-batches: "
                  f"microbatches {par.microbatches} must be a multiple of {rounds}")
    elif v != 1:
        c.add("spec.parallelism.virtualStages",
              f"schedule {par.schedule} runs one stage per rank (got {v}); more need an interleaved schedule")


def _batch(spec: JobSpec, c: _Checker, degrees_fit: bool) -> None:
    # Federated clients train on local batches of batchSize: nothing to split.
    if not degrees_fit or spec.mode == "federated":
        return
    if not c.ok("spec.mode", "spec.data.batchSize", "spec.parallelism.microbatches", "spec.training.gradAccumulation"):
        return
    dp, pp = spec.data_degree, spec.parallelism.pipeline
    mb, acc = spec.parallelism.microbatches, spec.training.grad_accumulation
    batch = spec.data.batch_size
    if pp > 1:
        parts = [f"data-parallel degree {dp}", f"microbatches {mb}", f"gradAccumulation {acc}"]
        divisor = dp * mb * acc
        note = ""
    else:
        parts = [f"data-parallel degree {dp}", f"gradAccumulation {acc}"]
        divisor = dp * acc
        note = " (microbatches count only when parallelism.pipeline > 1)"
    if batch % divisor:
        c.add(
            "spec.data.batchSize",
            f"{batch} is not divisible by {divisor} = {' x '.join(parts)}{note}; every rank needs an equal share",
        )


def _mode_blocks(spec: JobSpec, c: _Checker) -> None:
    if not c.ok("spec.mode"):
        return
    if spec.federated is not None and spec.mode != "federated":
        c.add("spec.federated", f"only allowed in mode federated (mode is {spec.mode}); remove it or set spec.mode: federated")
    if spec.param_server is not None and spec.mode != "paramserver":
        c.add(
            "spec.paramServer",
            f"only allowed in mode paramserver (mode is {spec.mode}); remove it or set spec.mode: paramserver",
        )
    if spec.mode == "paramserver" and c.ok("spec.workers.procsPerWorker") and spec.workers.procs_per_worker != 1:
        # Each worker is one process that talks to the servers on its own; there is nothing to share in a pod.
        c.add(
            "spec.workers.procsPerWorker",
            f"must be 1 in mode paramserver (got {spec.workers.procs_per_worker}); raise workers.replicas instead",
        )
    fed = spec.federated
    if fed is not None and c.ok("spec.federated.clients", "spec.federated.clientsPerRound"):
        if fed.clients_per_round > fed.clients:
            c.add(
                "spec.federated.clientsPerRound",
                f"{fed.clients_per_round} must be <= federated.clients {fed.clients}",
            )
    if fed is not None and c.ok("spec.federated.minAnsweredClients", "spec.federated.clientsPerRound"):
        if fed.min_answered_clients > fed.clients_per_round:
            c.add(
                "spec.federated.minAnsweredClients",
                f"{fed.min_answered_clients} must be <= federated.clientsPerRound {fed.clients_per_round}",
            )
    if fed is not None and fed.secure_aggregation and c.ok("spec.federated.secureAggregation"):
        if fed.compression != "none" and c.ok("spec.federated.compression"):
            c.add(
                "spec.federated.compression",
                f"{fed.compression} cannot be combined with secureAggregation: masked sums need dense "
                "fixed-point updates; set compression: none",
            )
        # Bonawitz et al.: the masks of a dropped client are recovered from t shares, and with
        # fewer than 2 clients answering the "sum" would be one client's update in the clear.
        if c.ok("spec.federated.minAnsweredClients") and fed.min_answered_clients < 2:
            c.add(
                "spec.federated.minAnsweredClients",
                f"{fed.min_answered_clients} must be >= 2 with secureAggregation (a sum of one update reveals it)",
            )
    if fed is not None:
        _fed_robust(fed, c)
        _fed_privacy(fed, c)


def _fed_robust(fed: FederatedSpec, c: _Checker) -> None:
    """Byzantine-robust rules: they need every update in the clear and enough of them."""
    if not c.ok("spec.federated.strategy") or fed.strategy not in ROBUST_STRATEGIES:
        return
    if fed.secure_aggregation and c.ok("spec.federated.secureAggregation"):
        c.add("spec.federated.strategy",
              f"{fed.strategy} needs each client's update, which secureAggregation hides (the aggregator "
              "sees only the sum): use fedavg, fedprox or fedadam with secureAggregation, or turn it off")
    answered = fed.min_answered_clients
    if fed.strategy == "trimmedMean" and c.ok("spec.federated.trimFraction", "spec.federated.clientsPerRound"):
        if fed.trim_fraction >= 0.5:
            c.add("spec.federated.trimFraction", f"{fed.trim_fraction} must be < 0.5 (it is cut at each end)")
        elif int(fed.trim_fraction * fed.clients_per_round) < 1:
            c.add("spec.federated.trimFraction",
                  f"{fed.trim_fraction} trims nothing from clientsPerRound {fed.clients_per_round} updates "
                  f"(floor({fed.trim_fraction} x {fed.clients_per_round}) = 0); raise it to at least "
                  f"{1 / fed.clients_per_round:.3g}, or use fedavg")
    if fed.strategy in ("krum", "multiKrum") and c.ok("spec.federated.byzantineClients",
                                                       "spec.federated.minAnsweredClients"):
        f = fed.byzantine_clients
        # Blanchard et al. 2017: Krum tolerates f of n only when n > 2f + 2.
        if answered < 2 * f + 3:
            c.add("spec.federated.minAnsweredClients",
                  f"{answered} must be >= 2 x byzantineClients + 3 = {2 * f + 3} with {fed.strategy} "
                  "(Krum tolerates f hostile clients of n only when n > 2f + 2)")
        m = fed.multi_krum_selected
        if fed.strategy == "multiKrum" and m is not None and c.ok("spec.federated.multiKrumSelected"):
            if m > answered - f:
                c.add("spec.federated.multiKrumSelected",
                      f"{m} must be <= minAnsweredClients - byzantineClients = {answered - f}: a round may "
                      f"close with {answered} updates, up to {f} of them hostile")


def _fed_privacy(fed: FederatedSpec, c: _Checker) -> None:
    dp = fed.privacy
    if dp is None or not c.ok("spec.federated.privacy"):
        return
    if fed.secure_aggregation and c.ok("spec.federated.secureAggregation"):
        c.add("spec.federated.privacy",
              "central differential privacy clips each update at the aggregator, which secureAggregation "
              "hides; turn one of them off")
    if c.ok("spec.federated.strategy") and fed.strategy in ROBUST_STRATEGIES:
        c.add("spec.federated.privacy",
              f"the noise is calibrated to a mean of clipped updates; strategy {fed.strategy} is not one "
              "(use fedavg, fedprox or fedadam with privacy)")
    if c.ok("spec.federated.privacy.delta", "spec.federated.clients") and dp.delta >= 1 / fed.clients:
        # A delta of 1/N lets the mechanism expose one of N clients' data outright with that chance.
        c.add("spec.federated.privacy.delta",
              f"{dp.delta:g} must be < 1 / clients = {1 / fed.clients:.3g} (smaller is usual, e.g. 1e-5)")


def _channel_security(spec: JobSpec, c: _Checker) -> None:
    fed = spec.federated
    if fed is not None and fed.token_secret_name and c.ok("spec.federated.tokenSecretName"):
        # Every client pod would mount the one key and could mint a token for any client id.
        c.add(
            "spec.federated.tokenSecretName",
            "is not supported: a token key shared by every client pod lets any of them speak for any "
            "client; remove it: the operator mints one credential per client and mounts each pod only its own",
        )


def _elastic(spec: JobSpec, c: _Checker) -> None:
    el = spec.elastic
    if el is None or not c.ok("spec.workers.replicas"):
        return
    replicas = spec.workers.replicas
    if c.ok("spec.elastic.minReplicas") and el.min_replicas > replicas:
        c.add("spec.elastic.minReplicas", f"{el.min_replicas} must be <= workers.replicas {replicas}")
    if c.ok("spec.elastic.maxReplicas") and el.max_replicas < replicas:
        c.add("spec.elastic.maxReplicas", f"{el.max_replicas} must be >= workers.replicas {replicas}")


def _elastic_sizes(spec: JobSpec, c: _Checker) -> None:
    el = spec.elastic
    # Every size of the range must be a valid gang: the operator may shrink or grow to any
    # of them, and a size that breaks a rule would only fail once the trainer starts there.
    # Checked only when the spec is valid at its own size; otherwise every size repeats the
    # same complaint.
    if el is None or c.errors or not c.ok("spec.workers", "spec.elastic", "spec.parallelism", "spec.data",
                                           "spec.training", "spec.mode"):
        return
    broken = {n: errs for n, errs in elastic_sizes(spec).items() if errs}
    if not broken:
        return
    sizes = sorted(broken)
    valid = [n for n in range(el.min_replicas, el.max_replicas + 1) if n not in broken]
    details = "; ".join(f"at {n}: {broken[n][0].path}: {broken[n][0].message}" for n in sizes[:2])
    more = f"; and {len(sizes) - 2} more" if len(sizes) > 2 else ""
    fix = (f"valid: {_ranges(valid)}; set minReplicas and maxReplicas so that every size between them is valid"
           if valid else "no size in it is valid")
    c.add(
        "spec.elastic",
        f"the range [{el.min_replicas}, {el.max_replicas}] contains sizes that break the spec: "
        f"{_ranges(sizes)} ({details}{more}); {fix}, or change the fields named",
    )


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    parts: list[str] = []
    for v in values:
        if parts and parts[-1].split("-")[-1] == str(v - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ", ".join(parts)


def _at_size(spec: JobSpec, replicas: int) -> JobSpec:
    return dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, replicas=replicas))


def elastic_sizes(spec: JobSpec) -> dict[int, list[FieldError]]:
    """Cross-field errors of the spec at every gang size of its elastic range (an empty
    list = a valid size). Without `elastic`, only its own size."""
    el = spec.elastic
    sizes = range(el.min_replicas, el.max_replicas + 1) if el is not None else [spec.workers.replicas]
    return {n: _size_rules(_at_size(spec, n)) for n in sizes}


def valid_sizes(spec: JobSpec) -> list[int]:
    """The gang sizes (pods) the operator may run this job at, ascending."""
    return [n for n, errs in elastic_sizes(spec).items() if not errs]


HOST_MEMORY_MODES = ("paramserver", "federated")


def _devices(spec: JobSpec, c: _Checker) -> None:
    gpus = spec.workers.resources.gpus
    if not c.ok("spec.workers.resources.gpus"):
        return
    if c.ok("spec.training.precision") and spec.training.precision == "fp16" and gpus == 0:
        c.add(
            "spec.training.precision",
            "fp16 needs GPUs (workers.resources.gpus is 0); use bf16 or fp32 on CPU",
        )
    if gpus > 0 and c.ok("spec.mode") and spec.mode in HOST_MEMORY_MODES:
        # Their workers exchange parameters as host bytes over gRPC and train on the CPU: a GPU
        # would sit idle while the job holds it.
        c.add(
            "spec.workers.resources.gpus",
            f"mode {spec.mode} trains on CPU (its workers exchange parameters over gRPC); "
            "set workers.resources.gpus to 0",
        )
    procs = spec.workers.procs_per_worker
    if c.ok("spec.workers.procsPerWorker") and gpus > 0 and procs > gpus:
        c.add(
            "spec.workers.procsPerWorker",
            f"{procs} processes per pod cannot each have a GPU: workers.resources.gpus is {gpus}",
        )


def _model(spec: JobSpec, c: _Checker) -> None:
    m = spec.model
    if not c.ok("spec.model.name"):
        return
    if c.ok("spec.data.name"):
        if m.name == "gpt" and spec.data.name not in LANGUAGE_DATA:
            c.add("spec.data.name", f"{spec.data.name} does not fit model gpt (a language model); use pytext or synthetic")
        if m.name in ("mlp", "cnn") and spec.data.name not in IMAGE_DATA:
            c.add(
                "spec.data.name",
                f"{spec.data.name} does not fit model {m.name} (an image classifier); use digits or synthetic",
            )
    if m.name != "gpt":
        return
    if c.ok("spec.model.hidden", "spec.model.heads") and m.hidden % m.heads:
        c.add("spec.model.hidden", f"{m.hidden} is not divisible by model.heads {m.heads}")
    tp = spec.parallelism.tensor
    if tp > 1 and c.ok("spec.parallelism.tensor"):
        # Megatron splits attention heads and the MLP's hidden units over the ranks.
        if c.ok("spec.model.heads") and m.heads % tp:
            c.add("spec.model.heads", f"{m.heads} is not divisible by parallelism.tensor {tp}")
        if c.ok("spec.model.hidden") and m.hidden % tp:
            c.add("spec.model.hidden", f"{m.hidden} is not divisible by parallelism.tensor {tp}")


def validate_spec(spec: JobSpec, *, skip: Iterable[FieldError] = ()) -> list[FieldError]:
    """Cross-field errors of a parsed spec, in a stable order.

    `skip`: schema errors already found; rules reading those fields are not run.
    """
    c = _Checker(skip)
    _size_dependent(spec, c)
    _strategies(spec, c)
    _mode_blocks(spec, c)
    _channel_security(spec, c)
    _elastic(spec, c)
    _devices(spec, c)
    _model(spec, c)
    _elastic_sizes(spec, c)
    _pod(spec, c)
    return c.errors


def _pod(spec: JobSpec, c: _Checker) -> None:
    """What the worker pods take from the spec (pod_rules.py): reserved mount paths, volume
    types, the workers.template allow-list."""
    if c.ok("spec.checkpoint.path", "spec.checkpoint.volume"):
        c.errors += pod_rules.checkpoint_errors(spec.checkpoint.path, spec.checkpoint.volume)
    if c.ok("spec.workers.template", "spec.checkpoint.path"):
        c.errors += pod_rules.template_errors(spec.workers.template, spec.checkpoint.path)


def _size_dependent(spec: JobSpec, c: _Checker) -> None:
    """The rules whose numbers involve the world size (workers.replicas)."""
    fit = _degrees(spec, c)
    _mode_degrees(spec, c, fit)
    _schedule(spec, c)
    _batch(spec, c, fit)


def _size_rules(spec: JobSpec) -> list[FieldError]:
    c = _Checker(())
    _size_dependent(spec, c)
    return c.errors


def validate_job(job: DistTrainJob) -> list[FieldError]:
    """Cross-field errors of a parsed job."""
    return validate_spec(job.spec)


def check_job(obj: Any) -> tuple[DistTrainJob, list[FieldError]]:
    """Schema and cross-field errors of a manifest, all at once, plus the best-effort job."""
    job, errors = parse_job_partial(obj)
    return job, errors + validate_spec(job.spec, skip=errors)


def load_job(obj: Any) -> DistTrainJob:
    """Parse and fully validate a manifest (a dict). Raises SpecError listing every problem."""
    job, errors = check_job(obj)
    if errors:
        raise SpecError(errors)
    return job
