"""Cross-field rules of the layout: degrees against the world size, each mode's degrees, the
data strategy and sequence parallelism, pipeline schedules, batch splits, devices and the model's
shape against its data and tensor degree."""

from __future__ import annotations

from .model import JobSpec
from .rule_checker import Checker

# Modes whose workers each hold a whole model replica.
REPLICA_MODES = ("data", "federated", "paramserver")
# Schedules that keep at most `stages` micro-batches in flight per stage, so a
# step with fewer micro-batches than stages never reaches the steady state.
SCHEDULES_NEED_MICROBATCHES = ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
# Schedules that place several (virtual) stages on each rank.
INTERLEAVED_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
HOST_MEMORY_MODES = ("paramserver", "federated")


def _world(spec: JobSpec) -> str:
    w = spec.workers
    return f"the world size {spec.world_size} (workers.replicas {w.replicas} x procsPerWorker {w.procs_per_worker})"


def degrees(spec: JobSpec, c: Checker) -> bool:
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


def mode_degrees(spec: JobSpec, c: Checker, degrees_fit: bool) -> None:
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


def strategies(spec: JobSpec, c: Checker) -> None:
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


def schedule(spec: JobSpec, c: Checker) -> None:
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


def batch(spec: JobSpec, c: Checker, degrees_fit: bool) -> None:
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


def devices(spec: JobSpec, c: Checker) -> None:
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


def model(spec: JobSpec, c: Checker) -> None:
    m = spec.model
    if m.init is not None and not m.init.strip() and c.ok("spec.model.init"):
        c.add("spec.model.init", "is empty; name a safetensors file, an export directory or a checkpoint, or leave it out")
    if not c.ok("spec.model.name"):
        return
    if m.hf_dir is not None:
        hf_model(spec, c)
        return
    language = m.name == "gpt" or spec.data.language or spec.data.builtin == "pytext"
    if language and spec.mode == "federated" and c.ok("spec.mode", "spec.data.name", "spec.data.format"):
        # A client's local loss and the aggregator's test accuracy are a classifier's (one label
        # per sample); next-token targets would crash every client in its first round.
        c.add("spec.mode", "federated trains classifiers: its clients' loss takes one label per sample, not a "
              "language model's next tokens (model gpt, data pytext or tokens, a text column); use mode data or "
              "paramserver")
        return
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


def hf_model(spec: JobSpec, c: Checker) -> None:
    """What an hf: model can be trained with. A Hugging Face model's forward is one call (no chain
    of one-tensor blocks a pipeline could cut), and its layers are whatever the architecture
    defines (no tensor-parallel plan that fits them all), so tensor and pipeline parallelism are
    refused; the data dimension (DDP, FSDP2 per transformer block) and parameter-server training
    take any module. Federated clients train classifiers only, so federated is refused too."""
    m, par = spec.model, spec.parallelism
    if not m.hf_dir or not m.hf_dir.strip():
        c.add("spec.model.name", "hf: needs a directory, e.g. hf:/models/my-gpt2")
        return
    if c.ok("spec.mode") and spec.mode == "federated":
        c.add("spec.mode", f"federated cannot train model {m.name}: federated clients train classifiers (their "
              "local loss takes one label per sample, not a language model's next tokens); use mode data or "
              "paramserver")
    if c.ok("spec.mode") and spec.mode == "pipeline":
        c.add("spec.mode", f"pipeline cannot train model {m.name}: a Hugging Face model is not a chain of "
              "one-tensor blocks a pipeline can cut; use mode data (ddp or fsdp)")
    elif c.ok("spec.parallelism.pipeline") and par.pipeline > 1:
        c.add("spec.parallelism.pipeline", f"{par.pipeline} cannot split model {m.name}: a Hugging Face model is "
              "not a chain of one-tensor blocks a pipeline can cut; use 1 (data ddp or fsdp)")
    if c.ok("spec.parallelism.tensor") and par.tensor > 1:
        c.add("spec.parallelism.tensor", f"{par.tensor} cannot shard model {m.name} in mode {spec.mode}: no "
              "tensor-parallel plan for Hugging Face models; use 1 and mode data with dataStrategy fsdp to "
              "shard its parameters")
    if c.ok("spec.training.activationCheckpointing") and spec.training.activation_checkpointing != "none":
        c.add("spec.training.activationCheckpointing", f"{spec.training.activation_checkpointing} is not applied to "
              f"model {m.name} (its blocks run inside the Hugging Face forward); use none")
