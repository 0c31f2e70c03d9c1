"""The data cache: converted data, staged objects and token scans, built once per job.

Where: DISTTRAIN_DATA_CACHE when it is set; else the folder `.data-cache` at the root of the
checkpoint volume (spec.checkpoint.path), which every pod of a job mounts and which outlives a
gang restart, as checkpoints must (a name no job's checkpoint folder can have: job names are DNS
labels). Any checkpoint volume does (a PersistentVolumeClaim, an NFS share, ...); with an emptyDir
(checkpoints on object storage, or no volume) each pod has its own cache, as before. Without a
writable checkpoint root (a process outside a job): the system's temp folder.

How: an entry's name is a digest of what it is built from (`key_name`: the source's fingerprint,
the fields that shape the result, a format version), so a changed file or spec builds a new
entry. One process builds an entry while every other one (the job's other pods and ranks) waits
on a lock file beside it (flock: held by an open file, so the kernel, or the NFS server when the
lease of a dead client runs out, releases it when the holder dies; no holder keeps it forever).
The builder writes into a temporary folder, fsyncs it and renames it into place: a reader sees a
whole entry or none, and the temporary folders of a builder that died are removed by the next
one, under the same lock, before it builds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from disttrain_api import constants as C

CACHE_FOLDER = ".data-cache"  # under the checkpoint root
TMP_PREFIX = ".tmp-"


def default_cache_dir(checkpoint_path: str) -> Path:
    """The data cache of a job whose spec.checkpoint.path is `checkpoint_path` (see above)."""
    explicit = os.environ.get(C.ENV_DATA_CACHE)
    if explicit:
        return Path(explicit)
    root = Path(os.environ.get(C.ENV_CHECKPOINT_DIR) or checkpoint_path)
    if root.is_dir() and os.access(root, os.W_OK):
        return root / CACHE_FOLDER
    return Path(tempfile.gettempdir()) / "disttrain-data"


def key_name(prefix: str, key: Any, length: int = 16) -> str:
    """`prefix-<digest of key>`: the name of the cache entry built from `key`."""
    return f"{prefix}-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:length]


def fingerprint(path: Path) -> list[Any]:
    """Path, size and mtime of a file, or of every file under a directory: a change rebuilds."""
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    return [[str(f.resolve()), (st := f.stat()).st_size, st.st_mtime_ns] for f in files]


def _log(message: str) -> None:
    print(f"disttrain-trainer: data cache: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(target: Path) -> Iterator[None]:
    """Hold the lock of cache entry `target` (a file `.<name>.lock` beside it) while inside; wait
    for it when another process holds it. A file system without locks: no lock (each process then
    builds its own copy; the atomic rename still publishes only whole ones)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as f:
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _log(f"waiting for {target.name}: another process builds it")
                fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            _log(f"{target.parent} takes no locks ({e.strerror}); building without one")
        yield  # closing the file releases the lock


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*"), reverse=True):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_once(target: Path, build: Callable[[Path], None], *, done: str, what: str = "") -> None:
    """Build `target` with build(tmp_dir) unless `target / done` exists already (see above).
    `what` names the source in the log line that says this process builds it."""
    if (target / done).exists():
        return
    with locked(target):
        if (target / done).exists():  # built by the process this one waited for
            _log(f"{target.name} is ready (built by another process)")
            return
        for stale in target.parent.glob(f"{TMP_PREFIX}{target.name}-*"):  # a dead builder's partial output
            _log(f"removing {stale.name}: the partial output of a builder that did not finish")
            shutil.rmtree(stale, ignore_errors=True)
        _log(f"building {target.name}{f' from {what}' if what else ''} (once: other processes wait)")
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}-", dir=target.parent))
        try:
            build(tmp)
            _fsync_tree(tmp)
            os.rename(tmp, target)
            _fsync_dir(target.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _log(f"built {target.name}")


def cached_json(cache: Path, key: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """compute() once per key, kept in the cache as a small JSON file (same lock and publish)."""
    target = cache / key_name("scan", key)
    build_once(target, lambda tmp: (tmp / "value.json").write_text(json.dumps(compute())), done="value.json")
    return json.loads((target / "value.json").read_text())
