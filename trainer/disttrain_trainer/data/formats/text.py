"""data.textColumn + data.tokenizer: a text column of parquet or jsonl, tokenized once into a
token stream in the data cache, then read like format tokens (tokens.token_data).

The tokenizer is a Hugging Face tokenizer directory (what `save_pretrained` writes), loaded with
AutoTokenizer offline: nothing is downloaded and no code from the directory runs. Each row's text
is tokenized without special tokens and followed by the tokenizer's end-of-sequence token (when
it has one), so documents stay apart in the stream, as nanoGPT's prepare scripts do. The stream
is uint16 when every id of the tokenizer fits, else uint32. The cache entry is keyed by the
source file and the tokenizer's files (path, size, mtime): a change of either tokenizes again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec, JobSpec

from ...process.config import ConfigError
from ..cache import build_once, fingerprint, key_name
from ..dataset import Dataset
from ..source import Source
from . import csv, hfdataset, jsonl, parquet
from .tokens import token_data

# format -> its reader of record batches: (path, columns, check(file, schema)) -> (file, batch) pairs
TEXT_READERS = {"parquet": parquet.record_batches, "jsonl": jsonl.record_batches, "csv": csv.record_batches,
                "hfdataset": hfdataset.record_batches}

FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
INFO_FILE = "tokens.json"


@dataclass(frozen=True, kw_only=True)
class TokenStream:
    path: Path
    dtype: str
    vocab: int  # the tokenizer's vocabulary, added tokens included


def tokenizer_dir(d: DataSpec) -> Path:
    """data.tokenizer as the trainer reads it: relative paths lie under the data volume's mount."""
    p = Path(d.tokenizer or "")
    return p if p.is_absolute() else Path(d.mount_path) / p


def load_tokenizer(d: DataSpec) -> Any:
    path = tokenizer_dir(d)
    if not path.is_dir():
        raise ConfigError(f"spec.data.tokenizer: {path} is not a directory (a tokenizer saved with save_pretrained)")
    from ...hf_models import transformers_offline  # noqa: PLC0415 - transformers only for tokenized text

    try:
        return transformers_offline().AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for an unreadable directory
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"spec.data.tokenizer: {path} is not a readable Hugging Face tokenizer "
                          f"({type(e).__name__}: {first})") from None  # fmt: skip


def _fingerprint_dir(path: Path) -> list[Any]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(path.iterdir()) if f.is_file()]


def _column_batches(d: DataSpec, path: Path) -> Iterator[Any]:
    """The text column a record batch at a time, read by the format's own reader (never whole)."""
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for columnar data

    col = d.text_column
    assert col is not None

    def check(where: Path, schema: Any) -> None:
        if col not in schema.names:
            raise ConfigError(f"spec.data.textColumn: {where} has no column {col!r} "
                              f"(it has {', '.join(schema.names) or 'none'})")  # fmt: skip
        kind = schema.field(col).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ConfigError(f"spec.data.textColumn: column {col!r} of {where} is {kind}, not text")

    for where, batch in TEXT_READERS[str(d.format)](path, [col], check):
        column = batch.column(col)
        if column.null_count:
            raise ConfigError(f"spec.data.textColumn: column {col!r} of {where} has empty values")
        yield column


def _write_stream(tok: Any, d: DataSpec, path: Path, out: Path, dtype: str) -> tuple[int, int]:
    """(tokens, rows) written to `out`."""
    eos = tok.eos_token_id
    tokens = rows = 0
    with open(out, "wb") as f:
        for column in _column_batches(d, path):
            ids = tok(column.to_pylist(), add_special_tokens=False)["input_ids"]
            flat = [t for row in ids for t in ([*row, eos] if eos is not None else row)]
            arr = np.asarray(flat, dtype=dtype)
            arr.tofile(f)
            tokens, rows = tokens + len(arr), rows + len(column)
    return tokens, rows


def tokenize(d: DataSpec, path: Path, cache: Path, source: list[Any]) -> TokenStream:
    """The token stream of `path`'s text column, built once in `cache`; `source`: the file's fingerprint."""
    tok = load_tokenizer(d)
    vocab = len(tok)
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    key = {"v": FORMAT_VERSION, "format": d.format, "source": source, "column": d.text_column,
           "tokenizer": [str(tokenizer_dir(d)), _fingerprint_dir(tokenizer_dir(d))], "dtype": dtype}  # fmt: skip
    target = cache / key_name("text", key)

    def build(tmp: Path) -> None:
        n, rows = _write_stream(tok, d, path, tmp / TOKENS_FILE, dtype)
        if n == 0:
            raise ConfigError(f"spec.data.textColumn: column {d.text_column!r} of {path} gives no tokens")
        (tmp / INFO_FILE).write_text(json.dumps({"tokens": n, "rows": rows, "dtype": dtype, "vocab": vocab}))

    build_once(target, build, done=INFO_FILE, what=f"column {d.text_column!r} of {path}")
    return TokenStream(path=target / TOKENS_FILE, dtype=dtype, vocab=vocab)


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    """The text column tokenized once into the cache, then read as a token file."""
    d = spec.data
    assert src.path is not None, "validation requires data.path with textColumn"
    stream = tokenize(d, src.path, cache, fingerprint(src.path))
    return token_data(spec, stream.path, None, stream.dtype, cache, name=src.name, default_vocab=stream.vocab,
                      source=f"{src.name} (column {d.text_column!r} tokenized by {d.tokenizer})")  # fmt: skip
