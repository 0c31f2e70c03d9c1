"""What a job trains and how: spec.parallelism, model, data, optimizer, training, checkpoint, elastic."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import QUANTITY_PATTERN, Object, Quantity, fld
from .fault_tolerance import SyncSpec
from .vocabulary import (
    ACT_CKPT_PATTERN,
    DATA_MODULE_PATTERN,
    FILE_NAME_PATTERN,
    HF_MODEL_PREFIX,
    LOSS_PATTERN,
    MODEL_NAME_PATTERN,
    NAME_PATTERN,
    CompileMode,
    Compression,
    DataFormat,
    DataName,
    DataStrategy,
    Decay,
    Optim,
    Partition,
    Precision,
    ScaleRule,
    Schedule,
    TokenDtype,
)


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    tensor: int = fld(1, minimum=1, desc="Tensor (intra-layer) parallel degree.")
    pipeline: int = fld(1, minimum=1, desc="Pipeline (inter-layer) parallel degree = stages.")
    schedule: Schedule = fld(
        "1F1B",
        desc="Pipeline schedule: Naive (one batch through the stages in turn), GPipe, 1F1B, Interleaved1F1B, "
        "InterleavedZeroBubble, ZBVZeroBubble (torch.distributed.pipelining) or PipeDream (asynchronous 1F1B "
        "with weight stashing).",
    )
    microbatches: int = fld(8, minimum=1, desc="Micro-batches per step in pipeline modes (Naive uses 1).")
    virtual_stages: int = fld(
        1, minimum=1, maximum=16,
        desc="Stages per rank: 1, or >= 2 for the interleaved schedules (exactly 2 for ZBVZeroBubble).",
    )
    partition: Partition = fld(
        "profile",
        desc="How blocks are split into stages: uniform (equal block counts), params (equal parameter counts) "
        "or profile (measured time and activation size, balanced by dynamic programming).",
    )
    data_strategy: DataStrategy = fld(
        "ddp",
        desc="The data dimension: ddp (every rank holds whole replicas and all-reduces gradients) or fsdp "
        "(FSDP2 fully_shard: parameters, gradients and optimizer state sharded ZeRO-3 style; modes data and "
        "hybrid with pipeline 1).",
    )
    sequence_parallel: bool = fld(
        False,
        desc="With tensor > 1: shard layer norms, dropout and the residual stream along the sequence "
        "(Korthikanti et al. 2022), turning each all-reduce into a reduce-scatter + all-gather.",
    )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str = fld(
        "mlp",
        pattern=MODEL_NAME_PATTERN,
        desc="Built-in model (mlp, cnn, gpt), 'module:factory', or 'hf:<directory>': a Hugging Face causal LM "
        "saved with save_pretrained (config.json and safetensors weights; a relative directory resolves under "
        "data.mountPath). Nothing is downloaded.",
    )
    hidden: int = fld(128, minimum=1, desc="Hidden width (MLP units, CNN channels, GPT embedding).")
    layers: int = fld(2, minimum=1, desc="Hidden layers (MLP) or transformer blocks (GPT).")
    heads: int = fld(4, minimum=1, desc="Attention heads (GPT).")
    block_size: int = fld(64, minimum=1, desc="Context length in tokens (GPT).")
    dropout: float = fld(0.0, minimum=0.0, maximum=1.0, desc="Dropout probability.")
    init: str | None = fld(
        None,
        desc="Weights to start from, a path every worker can read: a safetensors file, a directory holding "
        "model.safetensors (what a run exports), or a disttrain checkpoint (one step-N directory, or a "
        "checkpoint directory: its newest complete one). Loaded before the model is wrapped, in every mode; "
        "a resume from the job's own checkpoint takes precedence. With an hf: model also a Hugging Face "
        "directory (model.safetensors or its sharded index).",
    )
    init_strict: bool = fld(
        True,
        desc="With init: every parameter and buffer must be found with its shape, and nothing else may be "
        "there. false: load the names that match, leave the rest as initialised.",
    )

    @property
    def hf_dir(self) -> str | None:
        """The directory of an hf: model, as written (None for other models)."""
        return self.name[len(HF_MODEL_PREFIX):] if self.name.startswith(HF_MODEL_PREFIX) else None


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    name: DataName | None = fld(
        None,
        desc="A built-in dataset: digits (scikit-learn), pytext (text shipped with CPython), synthetic. Without "
        "name and path: digits. Not together with path.",
    )
    path: str | None = fld(
        None,
        desc="Your own data: a file or directory, absolute or relative to mountPath (disttrain local: relative to "
        "the manifest's folder), or an object-store URI s3://bucket/key (a file) or s3://bucket/prefix (a "
        "directory), read with spec.objectStore. Not together with name.",
    )
    format: DataFormat | None = fld(
        None,
        desc="How path is read (required with path): tokens (flat binary token ids, nanoGPT's train.bin/val.bin), "
        "npy (feature and label arrays), npz (keys of one archive), parquet, jsonl or csv (named columns), "
        "hfdataset (a Hugging Face datasets folder written by save_to_disk; named columns), imagefolder (one "
        "subfolder of images per class) or module (factory returns a map-style torch Dataset of (x, y) items).",
    )
    token_dtype: TokenDtype = fld("uint16", desc="format tokens: the width of one token id.")
    train_file: str = fld("train.bin", pattern=FILE_NAME_PATTERN, desc="format tokens, path a directory: the training tokens inside it.")
    validation_file: str = fld(
        "val.bin",
        pattern=FILE_NAME_PATTERN,
        desc="format tokens, path a directory: the validation tokens inside it; absent: the tail "
        "(validationFraction) of the training tokens is held out.",
    )
    features: str = fld(
        "x", pattern=NAME_PATTERN, desc="format npy: the feature array's file (<features>.npy in path, a directory); npz: its key."
    )
    labels: str = fld("y", pattern=NAME_PATTERN, desc="format npy: the label array's file (<labels>.npy in path, a directory); npz: its key.")
    feature_columns: tuple[str, ...] = fld(
        factory=tuple, pattern=NAME_PATTERN,
        desc="format parquet, jsonl, csv or hfdataset: numeric columns that form the features, in order (required)."
    )
    label_column: str = fld(
        "label", pattern=NAME_PATTERN,
        desc="format parquet, jsonl, csv or hfdataset: the label column (integer classes; numbers with training.loss mse).",
    )
    text_column: str | None = fld(
        None,
        pattern=NAME_PATTERN,
        desc="format parquet, jsonl, csv or hfdataset: a text column, tokenized once with tokenizer into a token stream for a "
        "language model (instead of featureColumns and labelColumn).",
    )
    tokenizer: str | None = fld(
        None,
        desc="With textColumn: a Hugging Face tokenizer directory (save_pretrained: tokenizer.json, "
        "tokenizer_config.json), absolute or relative to mountPath. Nothing is downloaded.",
    )
    factory: str | None = fld(
        None,
        pattern=DATA_MODULE_PATTERN,
        desc="format module: 'package.module:factory'; factory(path) returns a map-style torch Dataset whose "
        "items are (features, integer label). It is read once into the shard cache.",
    )
    validation_fraction: float = fld(
        0.1,
        minimum=0.0,
        maximum=0.5,
        exclusive_minimum=True,
        desc="The tail of your data held out for evaluation when it has no validation file.",
    )
    vocab_size: int = fld(
        0, minimum=0, desc="format tokens: the vocabulary (the GPT's output size); 0: the largest token id + 1."
    )
    classes: int = fld(0, minimum=0, desc="Classification data: the number of classes; 0: the largest label + 1.")
    image_size: int = fld(
        32, minimum=1, maximum=1024,
        desc="format imagefolder: every image is decoded once, converted to RGB and resized to imageSize x imageSize "
        "pixels (stored as uint8, scaled to [0, 1] as batches are read).",
    )
    mount_path: str = fld(
        "/data", pattern=r"^/.*", desc="Where volume is mounted (read-only) in every pod; relative paths resolve here."
    )
    volume: Object = fld(
        factory=Object,
        desc="A Kubernetes volume source holding path (e.g. persistentVolumeClaim: {claimName: corpus}), mounted "
        "read-only at mountPath in every pod; empty: nothing is mounted (the data is in the image).",
    )
    batch_size: int = fld(
        256,
        minimum=1,
        desc="Global batch size per optimizer step, split evenly over data-parallel ranks, micro-batches "
        "(when parallelism.pipeline > 1) and gradAccumulation micro-steps. In federated mode: each client's "
        "local batch size.",
    )
    seed: int = fld(0, minimum=0, desc="Seed for the split, the sampler and model initialisation.")
    shards: int = fld(4, minimum=1, maximum=4096, desc="Shard files the dataset is packed into.")
    synthetic_samples: int = fld(8192, minimum=1, desc="Samples of the synthetic dataset.")

    @property
    def language(self) -> bool:
        """Whether this data is token ids for a language model (a token file or a tokenized text column)."""
        return self.format == "tokens" or self.text_column is not None

    @property
    def builtin(self) -> DataName | None:
        """The built-in dataset this spec trains on (digits when it names neither one nor a path)."""
        if self.name is not None:
            return self.name
        return None if self.path or self.format is not None else "digits"


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    name: Optim = fld("sgd", desc="sgd (with momentum), adam or adamw.")
    lr: float = fld(0.1, minimum=0.0, exclusive_minimum=True, desc="Learning rate at baseBatchSize.")
    momentum: float = fld(0.9, minimum=0.0, maximum=1.0, desc="SGD momentum (ignored by adam/adamw).")
    weight_decay: float = fld(0.0, minimum=0.0, desc="L2 penalty (decoupled for adamw).")
    scale_lr: ScaleRule = fld("linear", json="scaleLR", desc="Large-batch rule: lr x (batchSize / baseBatchSize).")
    base_batch_size: int = fld(256, minimum=1, desc="Batch size the lr was tuned for.")
    warmup_steps: int = fld(0, minimum=0, desc="Gradual warmup from lr/scale to the scaled lr.")
    decay: Decay = fld("cosine", desc="Schedule after warmup.")
    min_lr_ratio: float = fld(0.0, minimum=0.0, maximum=1.0, json="minLRRatio", desc="Final lr as a fraction of peak.")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    steps: int = fld(500, minimum=1, desc="Optimizer steps.")
    precision: Precision = fld("fp32", desc="fp16 needs GPUs; bf16 and fp32 also run on CPU.")
    activation_checkpointing: str = fld("none", pattern=ACT_CKPT_PATTERN, desc="none, sqrt, or every:K.")
    gradient_compression: Compression = fld("none", desc="DDP communication hook.")
    powersgd_rank: int = fld(2, minimum=1, json="powerSGDRank", desc="Rank of PowerSGD's low-rank factors.")
    grad_accumulation: int = fld(1, minimum=1, desc="Micro-steps per optimizer step; only the last synchronises.")
    bucket_cap_mb: float = fld(25.0, minimum=0.0, exclusive_minimum=True, json="bucketCapMB", desc="DDP bucket size.")
    eval_interval_steps: int = fld(0, minimum=0, desc="Evaluate every N steps (0: only at the end).")
    log_interval_steps: int = fld(10, minimum=1, desc="Log metrics every N steps.")
    loss: str = fld(
        "cross_entropy", pattern=LOSS_PATTERN,
        desc="cross_entropy (classes, token ids), mse (numeric labels: regression; the model has one output), or "
        "'package.module:function': loss(outputs, labels) -> a scalar tensor, checked on one batch before training.",
    )
    compile: bool | CompileMode = fld(
        False,
        desc="torch.compile each block of the model and the loss (as torchtitan does): false, true (mode "
        "default) or a mode: default, max-autotune-no-cudagraphs. Modes data, tensor, hybrid and pipeline "
        "(not PipeDream); the compile time is reported apart (compileS).",
    )
    float8: bool = fld(
        False,
        desc="torchao's float8 training for the linear layers whose dimensions are multiples of 16 (tensor "
        "cores); with FSDP the all-gathers move float8 weights. Needs a GPU of compute capability 8.9 or newer "
        "(Ada, Hopper); refused on any other device.",
    )
    sync: SyncSpec = fld(
        factory=SyncSpec, desc="How often data-parallel replicas synchronise: every step, or LocalSGD / DiLoCo."
    )

    @property
    def compile_mode(self) -> CompileMode | None:
        """torch.compile's mode, None when compile is off."""
        if self.compile is False:
            return None
        return "default" if self.compile is True else self.compile


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    interval_steps: int = fld(50, minimum=1, desc="Save every N steps (and at the end).")
    keep: int = fld(3, minimum=1, desc="Newest checkpoints kept.")
    path: str = fld(
        "/checkpoints", pattern=r"^/.*",
        desc="Mount path of the checkpoint volume in worker pods; not one the operator mounts (/etc/disttrain, "
        "/run/disttrain, /tmp, /dev/termination-log) nor a folder holding one.",
    )
    volume: Object = fld(
        factory=Object,
        desc="A Kubernetes volume source for checkpoints (e.g. persistentVolumeClaim: {claimName: x}; no hostPath: "
        "worker pods are restricted). Empty: the operator creates a PersistentVolumeClaim <job>-checkpoints for the "
        "job (size, retain; the operator's checkpoint StorageClass). emptyDir: {} only when asked for: it dies with "
        "the pod, so a restarted gang starts from step 0 (condition CheckpointsEphemeral).",
    )
    size: Quantity | None = fld(
        None,
        pattern=QUANTITY_PATTERN,
        desc="Storage the operator's claim asks for (volume empty). Default: (keep + 2) x the model's weights and "
        "optimizer state in fp32, doubled, rounded up to whole Gi, at least 1Gi; 20Gi for a model it cannot size "
        "(module:factory, hf:).",
    )
    retain: bool = fld(
        False,
        desc="Keep the operator's claim when the job is deleted (it is created without an owner); the next job of "
        "the same name in the namespace reuses it and resumes from it. Read when the claim is created.",
    )
    uri: str | None = fld(
        None,
        desc="Checkpoints on object storage instead of a volume: s3://bucket/prefix (read with spec.objectStore). "
        "Each one is published by a commit marker after all its objects; resume picks the newest committed one. "
        "path is then local staging (an emptyDir). Not together with volume.",
    )


@dataclass(frozen=True, kw_only=True)
class ElasticSpec:
    min_replicas: int = fld(1, minimum=1, desc="Smallest gang (pods) the job may shrink to.")
    max_replicas: int = fld(4, minimum=1, desc="Largest gang (pods) the job may grow back to.")
    schedule_timeout_seconds: int = fld(60, minimum=1, desc="Wait this long for a full-size gang before shrinking.")
