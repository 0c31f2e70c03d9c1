"""Reference models behind a name -> factory registry.

Every model keeps its repeated layers in `self.blocks` (an nn.Sequential) so
activation checkpointing can cut it, and lists its ordered pipeline blocks in
`pipeline_blocks()` (see parallel/blocks.py for the contract). A factory takes
(spec, dataset) and returns the module; "package.module:factory" names a user
factory with the same signature; "hf:<dir>" a Hugging Face causal LM (hf_models.py).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from disttrain_api.model import HF_MODEL_PREFIX, JobSpec
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from . import losses
from .data import Dataset
from .parallel import tensor as tensor_parallel
from .parallel.activation_checkpointing import run_blocks
from .process.config import ConfigError
from .weights.initial import load_initial

Factory = Callable[[JobSpec, Dataset], nn.Module]


class MLP(nn.Module):
    def __init__(
        self, inputs: int, hidden: int, layers: int, classes: int, dropout: float, act_ckpt: str
    ):
        super().__init__()
        self.act_ckpt = act_ckpt
        self.stem = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU())
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout))
                for _ in range(layers - 1)
            )
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(run_blocks(self.blocks, self.stem(x.flatten(1)), self.act_ckpt))

    def pipeline_blocks(self) -> list[nn.Module]:
        return [nn.Sequential(nn.Flatten(1), self.stem), *self.blocks, self.head]

    def tensor_parallel_plan(self, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
        return tensor_parallel.mlp_plan(self, sequence_parallel=sequence_parallel)

    def tensor_parallel_block_plans(self, *, sequence_parallel: bool) -> list[dict[str, ParallelStyle]]:
        return tensor_parallel.mlp_block_plans(self, sequence_parallel=sequence_parallel)


class _Images(nn.Module):
    """Rows of features as (channels, side, side) images."""

    def __init__(self, channels: int, side: int):
        super().__init__()
        self.shape = (channels, side, side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, *self.shape)


class CNN(nn.Module):
    """A small CNN for square images: single-channel (digits' 8x8) or RGB (format imagefolder)."""

    def __init__(
        self, side: int, hidden: int, layers: int, classes: int, dropout: float, act_ckpt: str, channels: int = 1
    ):
        super().__init__()
        self.side, self.channels, self.act_ckpt = side, channels, act_ckpt
        self.stem = nn.Sequential(nn.Conv2d(channels, hidden, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1), nn.ReLU())
                for _ in range(layers - 1)
            )
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(4 * hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, self.channels, self.side, self.side)
        return self.head(run_blocks(self.blocks, self.stem(x), self.act_ckpt))

    def pipeline_blocks(self) -> list[nn.Module]:
        return [nn.Sequential(_Images(self.channels, self.side), self.stem), *self.blocks, self.head]


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ConfigError(f"model.hidden {dim} must be divisible by model.heads {heads}")
        self.head_dim, self.dropout = dim // heads, dropout
        # Output features are grouped per head as [q | k | v] of that head, so a
        # column-parallel split of the fused projection gives each tensor-parallel
        # rank whole heads (parallel/tensor.py); forward infers the local head count.
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        qkv = self.qkv(x).view(b, t, -1, 3 * hd).transpose(1, 2)
        q, k, v = qkv.split(hd, dim=3)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small character-level GPT in the style of nanoGPT (pre-LN blocks, causal SDPA)."""

    def __init__(
        self,
        vocab: int,
        block_size: int,
        dim: int,
        layers: int,
        heads: int,
        dropout: float,
        act_ckpt: str,
    ):
        super().__init__()
        self.block_size, self.act_ckpt = block_size, act_ckpt
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds model.blockSize {self.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        return self.head(self.ln_f(run_blocks(self.blocks, x, self.act_ckpt)))

    def pipeline_blocks(self) -> list[nn.Module]:
        return [_GPTEmbedding(self), *self.blocks, nn.Sequential(self.ln_f, self.head)]

    def tensor_parallel_plan(self, *, sequence_parallel: bool) -> dict[str, ParallelStyle]:
        return tensor_parallel.gpt_plan(self, sequence_parallel=sequence_parallel)

    def tensor_parallel_block_plans(self, *, sequence_parallel: bool) -> list[dict[str, ParallelStyle]]:
        return tensor_parallel.gpt_block_plans(self, sequence_parallel=sequence_parallel)

    def check_tensor_parallel(self, tp: int) -> None:
        tensor_parallel.check_gpt_heads(self, tp)


class _GPTEmbedding(nn.Module):
    """The GPT's first pipeline block: token + position embeddings (shares the GPT's parameters)."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.block_size = gpt.block_size
        self.tok, self.pos, self.drop = gpt.tok, gpt.pos, gpt.drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))


def _mlp(spec: JobSpec, ds: Dataset) -> nn.Module:
    m = spec.model
    _classifier_data("mlp", ds)
    return MLP(
        ds.input_dim,
        m.hidden,
        m.layers,
        ds.num_classes,
        m.dropout,
        spec.training.activation_checkpointing,
    )


def _cnn(spec: JobSpec, ds: Dataset) -> nn.Module:
    m = spec.model
    _classifier_data("cnn", ds)
    # One channel when the features make a square; else three (RGB: format imagefolder).
    channels = 1 if math.isqrt(ds.input_dim) ** 2 == ds.input_dim else 3
    side = math.isqrt(ds.input_dim // channels)
    if channels * side * side != ds.input_dim:
        raise ConfigError(
            f"model.name cnn needs square images (side x side, or 3 x side x side); data {ds.name} has "
            f"{ds.input_dim} features"
        )
    return CNN(
        side, m.hidden, m.layers, ds.num_classes, m.dropout, spec.training.activation_checkpointing, channels
    )


def _gpt(spec: JobSpec, ds: Dataset) -> nn.Module:
    m = spec.model
    if ds.kind != "lm":
        raise ConfigError(f"model.name gpt needs a text dataset (data.name: pytext), not {ds.name}")
    return GPT(
        ds.num_classes,
        m.block_size,
        m.hidden,
        m.layers,
        m.heads,
        m.dropout,
        spec.training.activation_checkpointing,
    )


def _classifier_data(model: str, ds: Dataset) -> None:
    if ds.kind != "classify":
        raise ConfigError(
            f"model.name {model} needs a classification dataset (digits or synthetic), not {ds.name}"
        )


MODELS: dict[str, Factory] = {"mlp": _mlp, "cnn": _cnn, "gpt": _gpt}


def _hf(spec: JobSpec, ds: Dataset) -> nn.Module:
    from . import hf_models  # noqa: PLC0415 - transformers is imported only for hf: models

    return hf_models.factory(spec, ds)


def resolve(name: str) -> Factory:
    if name in MODELS:
        return MODELS[name]
    if name.startswith(HF_MODEL_PREFIX):
        return _hf
    if ":" not in name:
        raise ConfigError(
            f"model.name {name!r}: not one of {', '.join(MODELS)} and not 'package.module:factory'"
        )
    module, attr = name.split(":", 1)
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"model.name {name!r}: cannot import ({e}); is the module installed in the image?"
        ) from None
    if not callable(factory):
        raise ConfigError(
            f"model.name {name!r} is not callable; it must be factory(spec, dataset) -> nn.Module"
        )
    return factory


def call_factory(name: str, factory: Factory, spec: JobSpec, dataset: Dataset) -> nn.Module:
    """`factory(spec, dataset)`, its signature and its result checked: a factory that cannot be
    called so, or returns something else than a module, is the job's config (exit 2), not a crash."""
    try:
        inspect.signature(factory).bind(spec, dataset)
    except TypeError as e:
        raise ConfigError(f"model.name {name!r}: the factory must accept (spec, dataset) ({e})") from None
    except ValueError:  # no signature to inspect (some builtins): calling it tells
        pass
    model = factory(spec, dataset)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.name {name!r} returned {type(model).__name__}; a factory must return a torch.nn.Module"
        )
    return model


def build_model(spec: JobSpec, dataset: Dataset) -> nn.Module:
    """Same seed on every rank -> identical initial replicas (DDP also broadcasts rank 0's);
    then model.init's weights, if any, before anything wraps or splits the module."""
    torch.manual_seed(spec.data.seed)
    model = call_factory(spec.model.name, resolve(spec.model.name), spec, dataset)
    if spec.model.init is not None:
        load_initial(model, spec.model)
    check_fits(spec.model.name, model, dataset)
    return model


PROBE_ROWS = 2


@torch.no_grad()
def check_fits(name: str, model: nn.Module, ds: Dataset) -> None:
    """One forward pass on PROBE_ROWS training rows, in eval mode (no dropout, no RNG drawn): a model
    that does not take the data, or returns logits of the wrong shape, is refused before any
    process group waits on it, with both shapes named, instead of failing every retry at step 1."""
    x, y = ds.batch(np.arange(min(PROBE_ROWS, ds.num_train)))
    xt = torch.from_numpy(np.asarray(x))
    expected = (*y.shape, ds.num_classes)
    was_training = model.training
    model.eval()
    try:
        out = model(xt)
    except Exception as e:  # noqa: BLE001 - whatever the forward raises, it raises on every retry
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"model.name {name!r} does not take data {ds.name}: a batch of shape {list(xt.shape)} "
                          f"({xt.dtype}) fails in forward: {type(e).__name__}: {first}") from None  # fmt: skip
    finally:
        model.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if ds.loss not in losses.BUILTIN and shape is not None:  # a loss of your own says what it takes
        losses.check(ds, out, torch.from_numpy(np.asarray(y)))
        return
    if shape != expected:
        got = list(shape) if shape is not None else type(out).__name__
        what = "one output per sample (a regression)" if ds.targets == "values" else f"{ds.num_classes} classes"
        raise ConfigError(f"model.name {name!r} returns {got} for a batch of shape {list(xt.shape)} of data {ds.name}; "
                          f"the loss needs outputs of shape {list(expected)} ({what})")  # fmt: skip
