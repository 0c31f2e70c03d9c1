"""model.name `hf:<dir>`: a Hugging Face `transformers` causal LM from a local directory.

The directory is what `save_pretrained` writes: config.json and safetensors weights
(model.safetensors, or shards with model.safetensors.index.json). It is loaded with AutoConfig and
AutoModelForCausalLM, offline (local_files_only, HF_HUB_OFFLINE): nothing is ever downloaded, and
no code from the directory is run (trust_remote_code stays off). The weights load strictly: a
missing, unexpected or misshapen name is a ConfigError listing them.

`HFCausalLM` adapts the model to the trainer's contract, forward(token ids) -> logits, and
registers the Hugging Face model's children as its own, so its state_dict names are the Hugging
Face names: the export (weights/hf_export.py) and model.init speak them. `fsdp_units()` names the
transformer blocks (the classes of the model's `_no_split_modules`) for FSDP2.

A relative directory resolves like data.path: under data.mountPath in a pod (disttrain local
makes it absolute against the manifest's folder first).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from disttrain_api.model import JobSpec
from safetensors import SafetensorError
from torch import nn

from .process.config import MAX_NAMES, ConfigError, listed

CONFIG_FILE = "config.json"
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json")


def transformers_offline() -> Any:
    """The transformers package, imported offline: the hub library reads these once, at import,
    so they are set first. Its progress bars are off: a trainer's log is one line per event."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers  # noqa: PLC0415 - transformers only for hf: models and tokenized text

    transformers.utils.logging.disable_progress_bar()
    return transformers


def model_dir(spec: JobSpec) -> Path:
    """The hf: model's directory as the trainer reads it."""
    raw = spec.model.hf_dir
    assert raw is not None, "only for hf: models"
    p = Path(raw)
    return p if p.is_absolute() else Path(spec.data.mount_path) / p


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_dir(spec: JobSpec) -> Path:
    """The directory, checked for what loading needs; a ConfigError naming what is missing."""
    d, name = model_dir(spec), spec.model.name
    if not d.is_dir():
        raise ConfigError(f"model.name {name}: {d} is not a directory (is the volume mounted in every worker?)")
    if not (d / CONFIG_FILE).is_file():
        raise ConfigError(f"model.name {name}: {d} has no {CONFIG_FILE}; save the model with "
                          "save_pretrained(dir) (config and weights)")  # fmt: skip
    if not any((d / f).is_file() for f in WEIGHTS_FILES):
        others = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".h5", ".msgpack"))
        hint = f" ({', '.join(others)} are not read: pickles may run code; save with safetensors)" if others else ""
        raise ConfigError(f"model.name {name}: {d} has no safetensors weights ({' or '.join(WEIGHTS_FILES)}){hint}")
    return d


def load_config(spec: JobSpec) -> Any:
    d = check_dir(spec)
    transformers = transformers_offline()
    try:
        return transformers.AutoConfig.from_pretrained(str(d), local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError) as e:
        raise ConfigError(f"model.name {spec.model.name}: {d / CONFIG_FILE} is not a config transformers can "
                          f"read: {_first_line(e)}") from None  # fmt: skip


def vocab_size(spec: JobSpec) -> int:
    """The model's vocabulary: the logits' width, and the bound every token id must stay under."""
    return int(load_config(spec).get_text_config().vocab_size)


def load(spec: JobSpec) -> nn.Module:
    """The Hugging Face model, fp32 (mixed precision is torch.amp's), weights loaded strictly."""
    config = load_config(spec)
    d, name = model_dir(spec), spec.model.name
    try:
        model, info = transformers_offline().AutoModelForCausalLM.from_pretrained(
            str(d), config=config, local_files_only=True, trust_remote_code=False, use_safetensors=True,
            dtype=torch.float32, output_loading_info=True,
        )  # fmt: skip
    except ValueError as e:  # an architecture AutoModelForCausalLM does not know, a damaged file
        raise ConfigError(f"model.name {name}: transformers cannot load a causal LM from {d}: {_first_line(e)}") from None
    except (OSError, RuntimeError, SafetensorError) as e:  # truncated or unreadable weights, shapes that do not fit
        raise ConfigError(f"model.name {name}: the weights in {d} do not load: {_first_line(e)}") from None
    problems = []
    for kind in ("missing", "unexpected", "mismatched"):
        names = sorted(str(k if isinstance(k, str) else k[0]) for k in info.get(f"{kind}_keys", ()))
        if names:
            problems.append(f"{kind} {len(names)} ({listed(names)})")
    if info.get("error_msgs"):
        problems.append("; ".join(str(m) for m in info["error_msgs"][:MAX_NAMES]))
    if problems:
        raise ConfigError(f"model.name {name}: the weights in {d} do not fit its config.json: {'; '.join(problems)}")
    return model


class HFCausalLM(nn.Module):
    """forward(token ids [batch, tokens]) -> logits [batch, tokens, vocab] of a transformers causal LM.

    The wrapped model's children are this module's children (same objects), so parameters and
    state_dict names are the Hugging Face ones; the model itself is held outside the module tree
    and called for forward."""

    def __init__(self, hf: nn.Module, *, name: str):
        super().__init__()
        own = [n for n, _ in hf.named_parameters(recurse=False)] + [n for n, _ in hf.named_buffers(recurse=False)]
        if own:  # nothing would register them here; no causal LM in transformers has any
            raise ConfigError(f"model.name {name}: {type(hf).__name__} holds tensors outside its submodules "
                              f"({', '.join(own)}); it cannot be trained here")  # fmt: skip
        for child_name, child in hf.named_children():
            self.add_module(child_name, child)
        object.__setattr__(self, "hf", hf)  # not a submodule: its children are registered above
        self.hf.config.use_cache = False  # training: no key/value cache

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=idx, use_cache=False).logits

    def train(self, mode: bool = True) -> HFCausalLM:
        super().train(mode)
        self.hf.training = mode  # the root's own flag (dropout and checkpointing checks read it)
        return self

    def fsdp_units(self) -> list[nn.Module]:
        """The transformer blocks: modules of the classes the model says must not be split."""
        kinds = set(getattr(self.hf, "_no_split_modules", None) or ())
        return [m for m in self.modules() if type(m).__name__ in kinds]


def _positions(config: Any) -> int | None:
    text = config.get_text_config()
    return getattr(text, "max_position_embeddings", None)


def factory(spec: JobSpec, ds: Any) -> nn.Module:
    """models.Factory of hf: models."""
    if ds.kind != "lm":
        raise ConfigError(f"model.name {spec.model.name} is a language model; data {ds.name} is not token ids")
    hf = load(spec)
    limit = _positions(hf.config)
    if limit is not None and spec.model.block_size > limit:
        raise ConfigError(f"model.blockSize {spec.model.block_size} exceeds the {limit} positions of model "
                          f"{spec.model.name} (config.json max_position_embeddings)")  # fmt: skip
    return HFCausalLM(hf, name=spec.model.name)
