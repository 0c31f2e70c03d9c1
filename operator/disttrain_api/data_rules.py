"""Cross-field rules of spec.data: a built-in dataset or your own files (never both), what each
file format needs, which models each kind of data fits, and the data volume's mount.

What needs the files themselves (do they exist, is a token file truncated, are the labels
integers) is checked by the trainer before training starts (disttrain_trainer.data)."""

from __future__ import annotations

import posixpath

from . import pod_rules
from .model import JobSpec
from .rule_checker import Checker

# Formats read as (features, label) rows; tokens is the language-model format.
ROW_FORMATS = ("npy", "npz", "parquet", "jsonl", "csv", "hfdataset", "imagefolder", "module")
COLUMN_FORMATS = ("parquet", "jsonl", "csv", "hfdataset")
BUILTIN_LOSSES = ("cross_entropy", "mse")
LANGUAGE_DATA = ("pytext", "synthetic")
IMAGE_DATA = ("digits", "synthetic")


def source(spec: JobSpec, c: Checker) -> None:
    d = spec.data
    if not c.ok("spec.data.name", "spec.data.path", "spec.data.format"):
        return
    if d.name is not None and (d.path or d.format is not None):
        c.add(
            "spec.data.path",
            f"give a built-in dataset (name: {d.name}) or your own data (path and format), not both; "
            "remove spec.data.name to train on the file",
        )
        return
    fmt = d.format
    if fmt is None:
        if d.path:
            c.add("spec.data.format", f"required with spec.data.path: one of tokens, {', '.join(ROW_FORMATS)}")
        return
    if not d.path and fmt != "module":
        c.add("spec.data.path", f"required with format {fmt}: the file or directory to read")
    if c.ok("spec.data.factory"):
        if fmt == "module" and not d.factory:
            c.add("spec.data.factory", "required with format module: 'package.module:factory'")
        if fmt != "module" and d.factory:
            c.add("spec.data.factory", f"only read with format module, not {fmt}")
    if c.ok("spec.data.featureColumns", "spec.data.textColumn"):
        if fmt in COLUMN_FORMATS and not d.feature_columns and d.text_column is None:
            c.add("spec.data.featureColumns", f"required with format {fmt}: the numeric columns forming the features "
                  "(or textColumn and tokenizer: text for a language model)")
        if fmt not in COLUMN_FORMATS and d.feature_columns:
            c.add("spec.data.featureColumns", f"only read with format {', '.join(COLUMN_FORMATS)}, not {fmt}")
        if d.feature_columns and d.text_column is not None:
            c.add("spec.data.textColumn", "give featureColumns (classification rows) or textColumn (text for a "
                  "language model), not both")
    _text(spec, c)
    if c.ok("spec.data.vocabSize") and d.vocab_size and fmt != "tokens":
        c.add("spec.data.vocabSize", f"only read with format tokens, not {fmt} (classification data has classes)")
    if c.ok("spec.data.classes") and d.classes and fmt == "tokens":
        c.add("spec.data.classes", "not read with format tokens (a language model's outputs are vocabSize)")


def _text(spec: JobSpec, c: Checker) -> None:
    """textColumn + tokenizer: a text column of parquet or jsonl tokenized into a token stream."""
    d = spec.data
    if not c.ok("spec.data.textColumn", "spec.data.tokenizer"):
        return
    if d.text_column is not None and d.format not in COLUMN_FORMATS:
        c.add("spec.data.textColumn", f"only read with format {', '.join(COLUMN_FORMATS)}, not {d.format}")
    elif d.text_column is not None and not (d.tokenizer or "").strip():
        c.add("spec.data.tokenizer", "required with textColumn: a Hugging Face tokenizer directory "
              "(tokenizer.json, tokenizer_config.json)")
    if d.tokenizer is not None and d.text_column is None:
        c.add("spec.data.tokenizer", "only read with textColumn (the text column it tokenizes)")
    if d.text_column is not None and c.ok("spec.data.classes") and d.classes:
        c.add("spec.data.classes", "not read with textColumn (a language model's outputs are its vocabulary)")


def loss(spec: JobSpec, c: Checker) -> None:
    """training.loss against the data: mse fits numeric labels of your own rows, not token ids."""
    d = spec.data
    if not c.ok("spec.training.loss", "spec.data.name", "spec.data.format", "spec.data.textColumn"):
        return
    if spec.training.loss != "cross_entropy" and spec.mode in ("federated", "paramserver"):
        c.add("spec.training.loss", f"mode {spec.mode} trains with cross_entropy (its clients and workers report "
              "accuracy); other losses train in the data, tensor, hybrid and pipeline modes")
        return
    if spec.training.loss == "mse" and (d.builtin is not None or d.language):
        what = f"data {d.builtin}" if d.builtin is not None else "token ids"
        c.add("spec.training.loss", f"mse needs numeric labels of your own rows (data.path with a row format), not "
              f"{what}; use cross_entropy, or a loss of your own ('package.module:function')")


def fits_model(spec: JobSpec, c: Checker) -> None:
    """Built-in models against the kind of data: the GPT reads token ids, mlp and cnn rows."""
    m, d = spec.model, spec.data
    if not c.ok("spec.model.name", "spec.data.name", "spec.data.format"):
        return
    builtin = d.builtin
    if m.hf_dir is not None:
        if builtin is not None or not d.language:
            c.add("spec.data.format" if builtin is None else "spec.data.name",
                  f"model {m.name} (a Hugging Face language model) reads token ids of its own tokenizer: give "
                  "data.path with format tokens, or format parquet/jsonl/csv/hfdataset with textColumn and tokenizer")
        return
    if builtin is not None:
        if m.name == "gpt" and builtin not in LANGUAGE_DATA:
            c.add("spec.data.name", f"{builtin} does not fit model gpt (a language model); use pytext or synthetic")
        if m.name in ("mlp", "cnn") and builtin not in IMAGE_DATA:
            c.add(
                "spec.data.name",
                f"{builtin} does not fit model {m.name} (an image classifier); use digits or synthetic",
            )
        return
    if m.name == "gpt" and d.format is not None and not d.language:
        c.add("spec.data.format", f"{d.format} does not fit model gpt (a language model); use format tokens, or "
              "parquet/jsonl/csv/hfdataset with textColumn")
    if m.name in ("mlp", "cnn") and d.language:
        what = "tokens" if d.format == "tokens" else "a text column"
        c.add("spec.data.format", f"{what} does not fit model {m.name} (a classifier); use a row format ("
              f"{', '.join(ROW_FORMATS)})")


def volume(spec: JobSpec, c: Checker) -> None:
    """The data volume: an allowed source, read-only at a mount path of its own."""
    d = spec.data
    if not c.ok("spec.data.mountPath", "spec.data.volume", "spec.data.path", "spec.checkpoint.path"):
        return
    if not d.volume:
        return
    bad = pod_rules.volume_source_error(d.volume)
    if bad is not None:
        key, why = bad
        if key == "" and "name" in d.volume:
            why = "give only the volume type (the operator names the volume)"
        c.add("spec.data.volume" + (f".{key}" if key else ""), why)
    elif "name" in d.volume:
        c.add("spec.data.volume.name", "give only the volume type (the operator names the volume)")
    mount = posixpath.normpath(d.mount_path)
    if (why := pod_rules.mount_path_error(mount)) is not None:
        c.add("spec.data.mountPath", why)
    ckpt = posixpath.normpath(spec.checkpoint.path)
    if mount == ckpt or mount.startswith(ckpt.rstrip("/") + "/") or ckpt.startswith(mount.rstrip("/") + "/"):
        c.add("spec.data.mountPath", f"{d.mount_path} overlaps spec.checkpoint.path {spec.checkpoint.path}; the data "
              "volume is mounted read-only, checkpoints need a writable folder of their own")
    if c.ok("spec.workers.template") and mount in _template_mount_paths(spec):
        c.add("spec.data.mountPath", f"{d.mount_path} is already mounted by spec.workers.template; choose another path")
    if d.path and d.path.startswith("/"):
        inside = posixpath.normpath(d.path)
        if inside != mount and not inside.startswith(mount.rstrip("/") + "/"):
            c.add("spec.data.path", f"{d.path} is outside spec.data.mountPath {d.mount_path}, where spec.data.volume "
                  "is mounted; give a path relative to the volume")


def _template_mount_paths(spec: JobSpec) -> set[str]:
    t = spec.workers.template
    mounts = list(t.get("volumeMounts") or [])
    for container in t.get("containers") or []:
        if isinstance(container, dict) and container.get("name", "trainer") == "trainer":
            mounts += list(container.get("volumeMounts") or [])
    return {posixpath.normpath(m["mountPath"]) for m in mounts
            if isinstance(m, dict) and isinstance(m.get("mountPath"), str) and m["mountPath"]}


def data(spec: JobSpec, c: Checker) -> None:
    source(spec, c)
    loss(spec, c)
    fits_model(spec, c)
    volume(spec, c)
