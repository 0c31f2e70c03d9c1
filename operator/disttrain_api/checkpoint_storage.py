"""Where a job's checkpoints live on a cluster, decided from its spec alone (the operator builds
the claim from it; `disttrain validate` warns from it).

- `checkpoint.volume` given: that volume. `emptyDir` and `ephemeral` die with their pod, so a
  restarted gang finds nothing and starts from step 0: allowed when asked for, and warned about.
- `checkpoint.uri` given: object storage; the volume is only local staging.
- neither: the operator creates one PersistentVolumeClaim for the job (CLAIM_SUFFIX), shared by
  every pod that mounts checkpoints, of `checkpoint.size` or a size derived from the model.

Standard library only, like the rest of the API package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import pod_rules
from .model import JobSpec

CLAIM_SUFFIX = "-checkpoints"
# Volume sources that live and die with one pod.
EPHEMERAL_SOURCES = ("emptyDir", "ephemeral")
# The size asked for a model whose parameters the spec does not tell (module:factory, hf:).
UNKNOWN_MODEL_SIZE_GI = 20
MIN_SIZE_GI = 1
# Checkpoints on the volume at once: `keep` complete ones, the one being written, and the export.
EXTRA_COPIES = 2
HEADROOM = 2.0  # metadata, DCP's per-rank files, a model that grows a little
BYTES_PER_PARAM = 4  # fp32: weights and optimizer state are kept in fp32 (fp16/bf16 keep fp32 masters)
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}  # momentum; Adam's two moments
# Input widths and class counts of data the spec names only by path: generous guesses, so the
# derived size errs on the large side.
UNKNOWN_FEATURES = 4096
UNKNOWN_CLASSES = 1000
DIGITS_FEATURES, DIGITS_CLASSES = 64, 10
SYNTHETIC_FEATURES, SYNTHETIC_CLASSES = 64, 10
PYTEXT_VOCAB = 256  # a character vocabulary: at most a byte's worth
TOKEN_VOCAB = {"uint16": 65536, "uint32": 262144}  # the largest id a token file can hold (uint32: a guess)
GI = 1024**3


def claim_name(job: str) -> str:
    return f"{job}{CLAIM_SUFFIX}"


def uses_default_claim(spec: JobSpec) -> bool:
    """Whether the operator creates the job's checkpoint claim (no volume, no object store)."""
    return not spec.checkpoint.volume and spec.checkpoint.uri is None


def volume_source(spec: JobSpec, job: str) -> dict[str, Any]:
    """The `checkpoints` volume of the job's pods: its claim, the spec's volume, or (object
    storage: checkpoint.path is only staging) an emptyDir."""
    if uses_default_claim(spec):
        return {"persistentVolumeClaim": {"claimName": claim_name(job)}}
    source = dict(spec.checkpoint.volume)
    if not source or pod_rules.volume_source_error(source) is not None:
        return {"emptyDir": {}}  # validation refuses any other; never a hostPath
    return source


def ephemeral_source(spec: JobSpec) -> str | None:
    """The volume type of a checkpoint volume that dies with its pod (emptyDir, ephemeral), else None."""
    if spec.checkpoint.uri is not None:
        return None  # the volume is only staging: checkpoints are committed to object storage
    kinds = [k for k in spec.checkpoint.volume if k in EPHEMERAL_SOURCES]
    return kinds[0] if kinds else None


def ephemeral_message(kind: str) -> str:
    return (f"an {kind} volume dies with its pod: a gang restarted after a failure, a lost node or a drain starts "
            "again from step 0. Leave spec.checkpoint.volume out (the operator then creates a PersistentVolumeClaim "
            "for the job) or name a persistentVolumeClaim of your own")


def estimated_parameters(spec: JobSpec) -> int | None:
    """Parameters of a built-in model, from the spec alone (an upper estimate where the data's
    width is not known); None for a model given by import path or a Hugging Face directory."""
    m, d = spec.model, spec.data
    h, layers = m.hidden, m.layers
    if m.name in ("mlp", "cnn"):
        if d.builtin == "digits":
            features, classes = DIGITS_FEATURES, DIGITS_CLASSES
        elif d.builtin == "synthetic":
            features, classes = SYNTHETIC_FEATURES, SYNTHETIC_CLASSES
        else:
            features, classes = UNKNOWN_FEATURES, d.classes or UNKNOWN_CLASSES
        if m.name == "mlp":  # stem, layers - 1 hidden blocks, head (with biases)
            return (features + 1) * h + (layers - 1) * (h + 1) * h + (h + 1) * classes
        # cnn: 3x3 convolutions, head over a 2x2 pool of the channels
        return 10 * h + (layers - 1) * (9 * h + 1) * h + (4 * h + 1) * classes
    if m.name == "gpt":
        if d.builtin == "pytext":
            vocab = PYTEXT_VOCAB
        else:
            vocab = d.vocab_size or TOKEN_VOCAB.get(str(d.token_dtype), TOKEN_VOCAB["uint32"])
        block = (h + 1) * 3 * h + (h + 1) * h + (h + 1) * 4 * h + (4 * h + 1) * h + 4 * h  # attention, MLP, norms
        return layers * block + 2 * vocab * h + m.block_size * h + 2 * h
    return None


def default_size_gi(spec: JobSpec) -> int:
    """(keep + EXTRA_COPIES) checkpoints of the weights and optimizer state in fp32, times
    HEADROOM, in whole Gi (at least MIN_SIZE_GI); UNKNOWN_MODEL_SIZE_GI for a model the spec
    does not size."""
    params = estimated_parameters(spec)
    if params is None:
        return UNKNOWN_MODEL_SIZE_GI
    one = params * BYTES_PER_PARAM * (1 + OPTIMIZER_SLOTS.get(spec.optimizer.name, 2))
    total = one * (spec.checkpoint.keep + EXTRA_COPIES) * HEADROOM
    return max(MIN_SIZE_GI, math.ceil(total / GI))


def claim_size(spec: JobSpec) -> str:
    return str(spec.checkpoint.size) if spec.checkpoint.size is not None else f"{default_size_gi(spec)}Gi"


def shared_by_several_pods(spec: JobSpec) -> bool:
    """Whether more than one pod mounts the checkpoint volume at a time: every gang of more than
    one pod, one that may grow (elastic), and the federated and parameter-server modes (servers
    beside their clients or workers)."""
    if spec.mode in ("federated", "paramserver"):
        return True
    grows = spec.elastic is not None and spec.elastic.max_replicas > 1
    return spec.workers.replicas > 1 or grows


def access_modes(spec: JobSpec) -> list[str]:
    """ReadWriteMany where pods on different nodes share the volume; ReadWriteOnce (what every
    provisioner offers) for a job of one pod, which moves between nodes only one pod at a time."""
    return ["ReadWriteMany"] if shared_by_several_pods(spec) else ["ReadWriteOnce"]


@dataclass(frozen=True, kw_only=True)
class SpecWarning:
    path: str
    message: str


def warnings(spec: JobSpec) -> list[SpecWarning]:
    """What is valid but probably not meant (`disttrain validate` prints them)."""
    kind = ephemeral_source(spec)
    if kind is None:
        return []
    return [SpecWarning(path=f"spec.checkpoint.volume.{kind}", message=ephemeral_message(kind))]
