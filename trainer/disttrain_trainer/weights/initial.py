"""spec.model.init: the weights a run starts from, loaded into the freshly built model.

models.build_model applies it before the model is wrapped (DDP, FSDP, tensor-parallel DTensors)
or cut into pipeline stages, so every mode starts from the same full tensors; a resume from the
job's own checkpoint loads afterwards and so takes precedence.

Sources, by what the path is:
  - a file: safetensors (read with the `safetensors` library; only the chosen names are read);
  - a directory holding model.safetensors: an export (weights/export.py), a Hugging Face
    directory (save_pretrained), or any such folder; or model.safetensors.index.json and its shards;
  - a disttrain checkpoint: one `step-N/` directory (whole `state.pt`, or sharded DCP, read
    without a process group), or a checkpoint directory, whose newest complete one is taken.
    Pipeline checkpoints key their blocks by block index; those names are mapped back to the
    model's through the blocks' shared parameters (parallel/blocks.py).

Strict (model.initStrict, the default): every name of the model's state_dict must be there with
its shape, and nothing else; a mismatch is a ConfigError listing the missing, unexpected and
misshapen names (a tied name, one tensor under two names, is found through either). Not
strict: the names that fit are loaded, the rest keep their initialisation.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from disttrain_api import constants as C
from disttrain_api.model import ModelSpec
from safetensors import SafetensorError, safe_open
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ..checkpoints import directory as cdir
from ..checkpoints import safe_state
from ..checkpoints import sharded as sharded_ckpt
from ..checkpoints import whole as whole_ckpt
from ..parallel.blocks import split_blocks
from ..process.config import ConfigError, listed

DCP_MODEL_PREFIX = "model."
SHARD_INDEX = "model.safetensors.index.json"  # a Hugging Face directory with its weights in shards  # checkpoints/sharded.py saves {"model": ..., "optimizer": ...}

Shape = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Source:
    """The tensors found at model.init: what `path` holds, their shapes, and a reader of a subset."""

    path: Path
    shapes: dict[str, Shape]
    read: Callable[[Sequence[str]], dict[str, torch.Tensor]]


@dataclass(frozen=True, kw_only=True)
class Fit:
    missing: list[str]
    unexpected: list[str]
    misshapen: list[tuple[str, Shape, Shape]]  # name, in the source, in the model
    matching: list[str]

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.misshapen)

    def describe(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing {len(self.missing)} ({listed(self.missing)})")
        if self.unexpected:
            parts.append(f"unexpected {len(self.unexpected)} ({listed(self.unexpected)})")
        if self.misshapen:
            shown = [f"{n}: {list(a)} in the file, {list(b)} in the model" for n, a, b in self.misshapen]
            parts.append(f"shape mismatch {len(shown)} ({listed(shown)})")
        return "; ".join(parts)


def compare(model_shapes: dict[str, Shape], found: dict[str, Shape]) -> Fit:
    return Fit(
        missing=sorted(n for n in model_shapes if n not in found),
        unexpected=sorted(n for n in found if n not in model_shapes),
        misshapen=sorted((n, found[n], s) for n, s in model_shapes.items() if n in found and found[n] != s),
        matching=sorted(n for n, s in model_shapes.items() if found.get(n) == s),
    )


def load_initial(model: nn.Module, spec: ModelSpec) -> Fit:
    """Load spec.init into `model` (unwrapped, on any device); returns how the names fitted."""
    assert spec.init is not None
    source = open_source(Path(spec.init), model)
    own = {n: tuple(t.shape) for n, t in model.state_dict().items() if isinstance(t, torch.Tensor)}
    fit = _tied_found(compare(own, source.shapes), _aliases(model))
    where = f"model.init {source.path}"
    if spec.init_strict and not fit.exact:
        raise ConfigError(f"{where} does not fit model {spec.name}: {fit.describe()}; set model.initStrict: false "
                          "to load only the names that fit")  # fmt: skip
    if not fit.matching:
        raise ConfigError(f"{where}: no tensor fits model {spec.name}: {fit.describe()}")
    model.load_state_dict(source.read(fit.matching), strict=False)  # names checked above; dtypes cast on copy
    if not fit.exact:
        print(f"disttrain-trainer: {where}: loaded {len(fit.matching)} tensors; not loaded: {fit.describe()}",
              flush=True)  # fmt: skip
    return fit


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """Names of one tensor under several names (tied weights: a language model's head is its
    token embedding), each name -> the others."""
    by_tensor: dict[int, set[str]] = {}
    for n, t in model.state_dict(keep_vars=True).items():
        if isinstance(t, torch.Tensor):
            by_tensor.setdefault(id(t), set()).add(n)
    return {n: names - {n} for names in by_tensor.values() if len(names) > 1 for n in names}


def _tied_found(fit: Fit, aliases: dict[str, set[str]]) -> Fit:
    """A tied name the source lacks is loaded through a name it shares its tensor with (a Hugging
    Face file stores tied weights once)."""
    found = {n for n in fit.missing if aliases.get(n, set()) & set(fit.matching)}
    return dataclasses.replace(fit, missing=[n for n in fit.missing if n not in found])


def open_source(path: Path, model: nn.Module) -> Source:
    if not path.exists():
        raise ConfigError(f"model.init {path}: no such file or directory (is the volume mounted in every worker?)")
    if path.is_file():
        return safetensors_source(path)
    if (path / C.EXPORT_WEIGHTS_FILENAME).is_file():
        return safetensors_source(path / C.EXPORT_WEIGHTS_FILENAME)
    if (path / SHARD_INDEX).is_file():
        return sharded_safetensors_source(path / SHARD_INDEX)
    if _is_checkpoint(path):
        return checkpoint_source(path, model)
    for _, step_dir in reversed(sharded_ckpt.list_checkpoints(path)):
        if _checkpoint_problem(step_dir) is None:
            return checkpoint_source(step_dir, model)
    raise ConfigError(f"model.init {path}: a directory with neither {C.EXPORT_WEIGHTS_FILENAME} nor a complete "
                      "disttrain checkpoint (step-N/)")  # fmt: skip


def _is_checkpoint(path: Path) -> bool:
    return (path / cdir.META_FILE).is_file() or (path / whole_ckpt.STATE_FILE).is_file() or (
        sharded_ckpt.is_sharded_checkpoint(path)
    )


def _checkpoint_problem(path: Path) -> str | None:
    if sharded_ckpt.is_sharded_checkpoint(path):
        return sharded_ckpt.verify(path)
    return cdir.manifest_problem(path, cdir.read_meta(path))


def safetensors_source(path: Path) -> Source:
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except (SafetensorError, OSError, ValueError) as e:
        raise ConfigError(f"model.init {path}: not a readable safetensors file ({e})") from None

    def read(names: Sequence[str]) -> dict[str, torch.Tensor]:
        try:
            with safe_open(str(path), framework="pt") as f:
                return {n: f.get_tensor(n) for n in names}
        except (SafetensorError, OSError, ValueError) as e:
            raise ConfigError(f"model.init {path}: cannot read its tensors ({e})") from None

    return Source(path=path, shapes=shapes, read=read)


def sharded_safetensors_source(index: Path) -> Source:
    """A Hugging Face directory's weights in several safetensors files, named by its index."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {index.parent / f for f in weight_map.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"model.init {index}: not a readable safetensors index ({type(e).__name__}: {e})") from None
    parts = [safetensors_source(f) for f in sorted(files)]
    owner = {n: part for part in parts for n in part.shapes}

    def read(names: Sequence[str]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for part in parts:
            out |= part.read([n for n in names if owner[n] is part])
        return out

    return Source(path=index.parent, shapes={n: s for part in parts for n, s in part.shapes.items()}, read=read)


def checkpoint_source(path: Path, model: nn.Module) -> Source:
    problem = _checkpoint_problem(path)
    if problem is not None:
        raise ConfigError(f"model.init {path}: an incomplete or damaged checkpoint: {problem}")
    if sharded_ckpt.is_sharded_checkpoint(path):
        return _dcp_source(path)
    try:
        # Read weights-only (checkpoints/safe_state.py): a file that names anything but tensors and
        # plain values is refused unread, whoever wrote it.
        state = safe_state.load(path / whole_ckpt.STATE_FILE)
    except Exception as e:  # noqa: BLE001 - whatever the loader says, the file is unusable
        raise ConfigError(f"model.init {path / whole_ckpt.STATE_FILE}: does not load ({type(e).__name__}: {e})") from None
    tensors = _model_tensors(path, state, model)
    return Source(path=path, shapes={n: tuple(t.shape) for n, t in tensors.items()},
                  read=lambda names: {n: tensors[n] for n in names})  # fmt: skip


def _model_tensors(path: Path, state: Any, model: nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(state, dict) and isinstance(state.get("model"), dict):  # data mode, the federated aggregator
        return {n: t for n, t in state["model"].items() if isinstance(t, torch.Tensor)}
    if isinstance(state, dict) and isinstance(state.get("blocks"), dict):  # a pipeline
        return _from_blocks(state["blocks"], model)
    raise ConfigError(f"model.init {path}: the checkpoint holds no model weights (a parameter-server checkpoint "
                      "holds one shard per server; export or init from a data or pipeline run)")  # fmt: skip


def _from_blocks(blocks_state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Block-indexed names ("3.attn.qkv.weight") as the model's: the blocks share its tensors.
    A block name the model cannot map stays as it is and shows up as unexpected."""
    by_id = {id(t): n for n, t in model.state_dict(keep_vars=True).items()}
    names = {
        f"{k}.{n}": by_id[id(t)]
        for k, block in enumerate(split_blocks(model))
        for n, t in block.state_dict(keep_vars=True).items()
        if id(t) in by_id
    }
    return {names.get(n, n): t for n, t in blocks_state.items()}


def _dcp_source(path: Path) -> Source:
    try:
        metadata = safe_state.SafeReader(path).read_metadata()
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.init {path}: DCP metadata does not load ({type(e).__name__}: {e})") from None
    found = {
        k[len(DCP_MODEL_PREFIX):]: md
        for k, md in metadata.state_dict_metadata.items()
        if k.startswith(DCP_MODEL_PREFIX) and isinstance(md, TensorStorageMetadata)
    }

    def read(names: Sequence[str]) -> dict[str, torch.Tensor]:
        model = {n: torch.empty(tuple(found[n].size), dtype=found[n].properties.dtype) for n in names}
        # no_dist: each process reads the whole tensors itself, no collective (the model is not sharded yet);
        # DCP warns that it assumes one process, which is the point here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load({"model": model}, checkpoint_id=path, no_dist=True, storage_reader=safe_state.SafeReader(path),
                     planner=safe_state.SafeLoadPlanner())  # fmt: skip
        return model

    return Source(path=path, shapes={n: tuple(md.size) for n, md in found.items()}, read=read)
