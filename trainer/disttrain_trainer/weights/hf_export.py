"""The export of an hf: model: a Hugging Face directory that `AutoModelForCausalLM.from_pretrained`
loads as it is (config.json, generation_config.json, model.safetensors, and the tokenizer's files
when data.tokenizer names one).

The trained tensors (the model's state_dict names, which hf_models.HFCausalLM keeps equal to the
Hugging Face names) are assigned to a model built on the meta device from the job's config, which
costs no memory of its own, and written by `save_pretrained`: tied weights stored once, shards and
their index when the model is large, as transformers itself writes them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from disttrain_api.model import JobSpec

from ..data.formats.text import load_tokenizer
from ..process.config import ConfigError

INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"


def write(out: Path, tensors: dict[str, torch.Tensor], *, spec: JobSpec) -> str:
    """Write the Hugging Face directory into `out` (exists, empty); returns the weights' file name."""
    from .. import hf_models  # noqa: PLC0415 - transformers only for hf: models

    try:
        config = hf_models.load_config(spec)
    except ConfigError as e:  # it loaded at the start; gone since: the export fails, retried with the run
        raise OSError(f"the model's config cannot be read for the export: {e}") from None
    with torch.device("meta"):
        model = hf_models.transformers_offline().AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [n for n in missing if n not in tied]
    if missing or unexpected:  # the trainer built this model from the same config: a bug, not the user's
        raise RuntimeError(f"the trained state does not fit {type(model).__name__}: missing {missing[:6]}, "
                           f"unexpected {unexpected[:6]}")  # fmt: skip
    model.tie_weights()
    model.save_pretrained(str(out), safe_serialization=True)
    if spec.data.tokenizer:
        try:
            load_tokenizer(spec.data).save_pretrained(str(out))
        except ConfigError as e:  # it tokenized the data at the start; gone since
            raise OSError(f"the tokenizer cannot be copied into the export: {e}") from None
    return INDEX_FILE if (out / INDEX_FILE).is_file() else WEIGHTS_FILE
