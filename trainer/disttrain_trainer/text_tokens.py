"""data.textColumn + data.tokenizer: a text column of parquet or jsonl, tokenized once into a
token stream in the data cache, then read like format tokens (file_datasets.py).

The tokenizer is a Hugging Face tokenizer directory (what `save_pretrained` writes), loaded with
AutoTokenizer offline: nothing is downloaded and no code from the directory runs. Each row's text
is tokenized without special tokens and followed by the tokenizer's end-of-sequence token (when
it has one), so documents stay apart in the stream, as nanoGPT's prepare scripts do. The stream
is uint16 when every id of the tokenizer fits, else uint32. The cache entry is keyed by the
source file and the tokenizer's files (path, size, mtime): a change of either tokenizes again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from disttrain_api.model import DataSpec

from .data_cache import build_once
from .process.config import ConfigError

FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
INFO_FILE = "tokens.json"
BATCH_ROWS = 1024  # rows tokenized per call: the fast tokenizer batches them in Rust


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
    from .hf_models import transformers_offline  # noqa: PLC0415 - transformers only for tokenized text

    try:
        return transformers_offline().AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for an unreadable directory
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"spec.data.tokenizer: {path} is not a readable Hugging Face tokenizer "
                          f"({type(e).__name__}: {first})") from None  # fmt: skip


def _fingerprint_dir(path: Path) -> list[Any]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(path.iterdir()) if f.is_file()]


def _texts(d: DataSpec, path: Path) -> list[str]:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow, only for parquet and jsonl data

    col = d.text_column
    assert col is not None
    try:
        if d.format == "parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415 - pyarrow

            names = pq.read_schema(path).names if path.is_file() else pq.ParquetDataset(path).schema.names
            if col not in names:
                raise ConfigError(f"spec.data.textColumn: {path} has no column {col!r} (it has {', '.join(names) or 'none'})")
            column = pq.read_table(path, columns=[col]).column(col)
        else:
            import pyarrow.json as pj  # noqa: PLC0415 - pyarrow

            table = pj.read_json(path)
            if col not in table.column_names:
                raise ConfigError(f"spec.data.textColumn: {path} has no column {col!r} "
                                  f"(it has {', '.join(table.column_names) or 'none'})")  # fmt: skip
            column = table.column(col)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"spec.data.path: {path} is not readable as {d.format} ({e})") from None
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise ConfigError(f"spec.data.textColumn: column {col!r} of {path} is {column.type}, not text")
    if column.null_count:
        raise ConfigError(f"spec.data.textColumn: column {col!r} of {path} has {column.null_count} empty values")
    return column.to_pylist()


def _write_stream(tok: Any, texts: list[str], out: Path, dtype: str) -> int:
    eos = tok.eos_token_id
    written = 0
    with open(out, "wb") as f:
        for start in range(0, len(texts), BATCH_ROWS):
            ids = tok(texts[start : start + BATCH_ROWS], add_special_tokens=False)["input_ids"]
            flat = [t for row in ids for t in ([*row, eos] if eos is not None else row)]
            arr = np.asarray(flat, dtype=dtype)
            arr.tofile(f)
            written += len(arr)
    return written


def tokenize(d: DataSpec, path: Path, cache: Path, source: list[Any]) -> TokenStream:
    """The token stream of `path`'s text column, built once in `cache`; `source`: the file's fingerprint."""
    tok = load_tokenizer(d)
    vocab = len(tok)
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    key = {"v": FORMAT_VERSION, "format": d.format, "source": source, "column": d.text_column,
           "tokenizer": [str(tokenizer_dir(d)), _fingerprint_dir(tokenizer_dir(d))], "dtype": dtype}  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    target = cache / f"text-{digest}"

    def build(tmp: Path) -> None:
        texts = _texts(d, path)
        n = _write_stream(tok, texts, tmp / TOKENS_FILE, dtype)
        if n == 0:
            raise ConfigError(f"spec.data.textColumn: column {d.text_column!r} of {path} gives no tokens")
        (tmp / INFO_FILE).write_text(json.dumps({"tokens": n, "rows": len(texts), "dtype": dtype, "vocab": vocab}))

    build_once(target, build, done=INFO_FILE)
    return TokenStream(path=target / TOKENS_FILE, dtype=dtype, vocab=vocab)
