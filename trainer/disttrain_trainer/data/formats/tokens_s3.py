"""A `tokens` file on object storage (s3://), read where it lies: every rank fetches only the
windows of its own rows, each one ranged GET, all of a batch's GETs concurrently (s3fs's
cat_ranges). The data loop names the next batches before it trains on the current one
(`prefetch`), so their reads overlap the step and the loop rarely waits for the store.

Nothing is downloaded whole: the file's size, the held-out validation windows and, only without a
known vocabulary (data.vocabSize, an hf: model's), the one-off scan for the largest token id
(streamed in chunks, once per job: its result is kept in the data cache) are all the reads
outside the batches.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from disttrain_api.model import JobSpec

from ...process.config import ConfigError
from .. import lm, object_store
from ..cache import cached_json
from ..dataset import PREFETCH_BATCHES, Dataset
from ..object_store import Store
from ..source import Source

FETCH_THREADS = 2
SCAN_CHUNK_BYTES = 32 << 20  # bytes per read of the one-off max scan: bounded memory on any file size


@dataclass(frozen=True, kw_only=True)
class RemoteTokenFile:
    """Language-model windows over a token object: sample i = tokens[start + i : + block + 1]."""

    store: Store
    uri: str
    dtype: str
    start: int
    windows: int
    block_size: int

    def _state(self) -> tuple[ThreadPoolExecutor, OrderedDict[bytes, Future[np.ndarray]]]:
        state = self.__dict__.get("_prefetch")
        if state is None:
            state = (ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="tokens-prefetch"), OrderedDict())
            object.__setattr__(self, "_prefetch", state)
        return state

    def fetch(self, rows: np.ndarray) -> np.ndarray:
        """The windows of `rows`, read now: one ranged GET per window, all at once."""
        rows = np.asarray(rows, dtype=np.int64)
        item = np.dtype(self.dtype).itemsize
        width = (self.block_size + 1) * item
        starts = ((self.start + rows) * item).tolist()
        ends = [s + width for s in starts]
        try:
            parts = self.store.filesystem().cat_ranges([self.uri] * len(starts), starts, ends)
        except Exception as e:  # noqa: BLE001 - unreachable: transient; anything else names the object
            raise object_store.explain(e, self.uri, "spec.data.path", self.store) from None
        for p in parts:
            if isinstance(p, BaseException):
                raise object_store.explain(p, self.uri, "spec.data.path", self.store)
            if len(p) != width:  # the object shrank under the job: its windows are no longer there
                raise ConfigError(f"spec.data.path: {self.uri} returned {len(p)} bytes for a window of {width}; "
                                  "was the object replaced while the job ran?")  # fmt: skip
        return np.frombuffer(b"".join(parts), dtype=self.dtype).reshape(len(starts), self.block_size + 1)

    def prefetch(self, batches: list[np.ndarray]) -> None:
        """Start reading the windows of the coming `batches` in the background."""
        pool, pending = self._state()
        for rows in batches:
            key = np.asarray(rows, dtype=np.int64).tobytes()
            if key not in pending:
                pending[key] = pool.submit(self.fetch, rows)
        while len(pending) > 2 * PREFETCH_BATCHES:  # batches nobody took (a resumed sampler skipped them)
            pending.popitem(last=False)[1].cancel()

    def take(self, rows: np.ndarray) -> np.ndarray:
        _, pending = self._state()
        future = pending.pop(np.asarray(rows, dtype=np.int64).tobytes(), None)
        return future.result() if future is not None else self.fetch(rows)


def _scan_max(store: Store, uri: str, dtype: str, size: int) -> int:
    """The largest token id of the object, read in chunks of SCAN_CHUNK_BYTES."""
    top, item = 0, np.dtype(dtype).itemsize
    chunk = SCAN_CHUNK_BYTES - SCAN_CHUNK_BYTES % item
    try:
        with store.filesystem().open(uri, "rb", block_size=chunk, cache_type="none") as f:
            for _ in range(0, size, chunk):
                data = f.read(chunk)
                if data:
                    top = max(top, int(np.frombuffer(data, dtype=dtype).max()))
    except Exception as e:  # noqa: BLE001
        raise object_store.explain(e, uri, "spec.data.path", store) from None
    return top


def _object(store: Store, uri: str, dtype: str, what: str) -> tuple[str, int, str] | None:
    found = object_store.info(store, uri, "spec.data.path")
    if found is None or found.get("type") == "directory":
        return None
    size, item = int(found.get("size") or 0), np.dtype(dtype).itemsize
    if size == 0 or size % item:
        raise ConfigError(
            f"spec.data.path: {uri} holds {size} bytes, not a whole number of {dtype} token ids ({item} bytes "
            "each): the object is truncated or spec.data.tokenDtype is wrong"
        )
    return uri, size // item, str(found.get("ETag") or "")


def read(spec: JobSpec, src: Source, cache: Path) -> Dataset:
    """The token Dataset of spec.data.path, an s3:// object or a prefix holding train_file (and
    validation_file, else the tail of the training tokens is held out)."""
    d, block = spec.data, spec.model.block_size
    assert src.uri is not None, "the table reads format tokens on object storage in place"
    store, uri = object_store.store_for(spec), src.uri.rstrip("/")
    train = _object(store, uri, d.token_dtype, "the training tokens")
    val = None
    if train is None:  # a prefix: nanoGPT's train.bin / val.bin inside it
        train = _object(store, f"{uri}/{d.train_file}", d.token_dtype, "the training tokens")
        if train is None:
            raise ConfigError(f"spec.data.path: neither {uri} nor {uri}/{d.train_file} is an object at "
                              f"{store.describe()}")  # fmt: skip
        val = _object(store, f"{uri}/{d.validation_file}", d.token_dtype, "the validation tokens")
    files = [f for f in (train, val) if f is not None]
    def scan(u: str, n: int, etag: str) -> int:  # once per job (the data cache), keyed by the ETag
        key = {"v": 1, "scan": "s3-tokens", "uri": u, "tokens": n, "etag": etag, "dtype": d.token_dtype}
        return cached_json(cache, key, lambda: _scan_max(store, u, d.token_dtype, n * np.dtype(d.token_dtype).itemsize))

    # Scanned only without a known vocabulary (data.vocabSize, an hf: model's).
    vocab = lm.vocabulary(spec, lambda: [(u, scan(u, n, etag)) for u, n, etag in files])
    train_uri, n_train, _ = train
    train_tokens, val_uri, val_start, val_len = n_train, train_uri, 0, 0
    if val is None:  # hold out the tail of the training tokens
        train_tokens = int(n_train * (1 - d.validation_fraction))
        val_start, val_len = train_tokens, n_train - train_tokens
    else:
        val_uri, val_len = val[0], val[1]
    lm.check_lengths(spec, [("training", train_tokens, train_uri), ("validation", val_len, val_uri)])
    window = lambda u, start, n: RemoteTokenFile(  # noqa: E731
        store=store, uri=u, dtype=d.token_dtype, start=start, windows=n, block_size=block)
    windows = train_tokens - block - 1
    validation = window(val_uri, val_start, val_len - block - 1)
    return lm.dataset(spec, name=src.name, vocab=vocab, train=window(train_uri, 0, windows), windows=windows,
                      test_windows=lambda: validation.fetch(lm.eval_starts(spec, val_len)))  # fmt: skip
