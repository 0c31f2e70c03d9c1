"""The API's identity (group, version, kind, names) and its vocabulary: the enumerations every
spec field draws from, and the patterns and limits of names."""

from __future__ import annotations

from typing import Literal

GROUP = "disttrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DistTrainJob"
PLURAL = "disttrainjobs"
SINGULAR = "disttrainjob"
SHORT_NAMES = ("dtj",)
CATEGORIES = ("disttrain",)

Mode = Literal["data", "pipeline", "tensor", "hybrid", "federated", "paramserver"]
Schedule = Literal[
    "Naive", "GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "PipeDream"
]
Partition = Literal["uniform", "params", "profile"]
DataStrategy = Literal["ddp", "fsdp"]
Precision = Literal["fp32", "bf16", "fp16"]
Compression = Literal["none", "fp16", "powersgd"]
# training.compile: true is torch.compile's "default" mode; "max-autotune-no-cudagraphs" autotunes
# the kernels without CUDA graphs (which do not compose with FSDP's and DDP's hooks).
CompileMode = Literal["default", "max-autotune-no-cudagraphs"]
Optim = Literal["sgd", "adam", "adamw"]
ScaleRule = Literal["none", "linear", "sqrt"]
Decay = Literal["none", "cosine", "linear", "step"]
DataName = Literal["digits", "pytext", "synthetic"]
DataFormat = Literal["tokens", "npy", "npz", "parquet", "jsonl", "csv", "hfdataset", "imagefolder", "module"]
TokenDtype = Literal["uint16", "uint32"]
FedStrategy = Literal["fedavg", "fedprox", "fedadam", "fedmedian", "trimmedMean", "krum", "multiKrum"]
# Rules over the individual updates (a secure aggregate hides them).
ROBUST_STRATEGIES = ("fedmedian", "trimmedMean", "krum", "multiKrum")
FedCompression = Literal["none", "int8", "topk"]
FedPartitionKind = Literal["iid", "dirichlet"]
CleanPodPolicy = Literal["Running", "All", "None"]
Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
ConditionStatus = Literal["True", "False", "Unknown"]

BUILTIN_MODELS = ("mlp", "cnn", "gpt")
# model.name "hf:<directory>": a Hugging Face causal LM saved with save_pretrained. The prefix is
# reserved: "hf:x" is always a directory, never the attribute x of a module named hf.
HF_MODEL_PREFIX = "hf:"
# A built-in name, a Hugging Face directory, or an import path "package.module:factory".
MODEL_NAME_PATTERN = r"^(mlp|cnn|gpt|hf:.+|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
# format module's dataset factory: "package.module:factory".
DATA_MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# training.loss: a built-in loss, or 'package.module:function' (a loss of your own).
LOSS_PATTERN = r"^(cross_entropy|mse|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
# A file inside spec.data.path (no folders: it must stay inside), and a column, key or array name.
FILE_NAME_PATTERN = r"^[^/]+$"
NAME_PATTERN = r"^.+$"
ACT_CKPT_PATTERN = r"^(none|sqrt|every:[1-9][0-9]*)$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Secret's name (RFC 1123 subdomain) and an object store's endpoint URL.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENDPOINT_PATTERN = r"^https?://[^/\s]+/?$"
# An experiment-tracking server (spec.tracking.mlflow.uri): a URL that may carry a path prefix.
TRACKING_URI_PATTERN = r"^https?://[^/\s]+(/\S*)?$"
# A job's name is its headless Service's name, so it must be a DNS-1035 label (a Service
# name starts with a letter), short enough that every derived name stays a 63-character
# label: pods and hostnames "<job>-worker-<index>" / "<job>-client-<index>" (index < 1024),
# Services "<job>-aggregator", "<job>-server-<shard>".
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_JOB_NAME = 45
TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
