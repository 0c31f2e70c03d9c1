"""The data cache: entries built once, atomically, whichever rank gets there first.

Several ranks (and restarted gangs) may build the same entry at once: each builds into its own
temporary directory beside the target and renames it into place; the first rename wins and the
others' identical copies are dropped. A reader never sees a half-built entry.

An entry's name is a digest of what it is built from (`key_name`): the source's fingerprint
(path, size and mtime of every file), the fields that shape the result and a format version, so
a changed file or spec builds a new entry instead of reading a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from disttrain_api import constants as C


def default_cache_dir() -> Path:
    return Path(os.environ.get(C.ENV_DATA_CACHE) or Path(tempfile.gettempdir()) / "disttrain-data")


def key_name(prefix: str, key: Any, length: int = 16) -> str:
    """`prefix-<digest of key>`: the name of the cache entry built from `key`."""
    return f"{prefix}-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:length]


def fingerprint(path: Path) -> list[Any]:
    """Path, size and mtime of a file, or of every file under a directory: a change rebuilds."""
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    return [[str(f.resolve()), (st := f.stat()).st_size, st.st_mtime_ns] for f in files]


def build_once(target: Path, build: Callable[[Path], None], *, done: str) -> None:
    """Build `target` with build(tmp_dir) unless `target / done` exists already."""
    if (target / done).exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another rank won the race; its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_json(cache: Path, key: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """compute() once per key, kept in the cache dir (written atomically; ranks may race)."""
    target = cache / (key_name("scan", key) + ".json")
    if target.exists():
        return json.loads(target.read_text())
    value = compute()
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=cache)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)
    os.replace(tmp, target)
    return value
