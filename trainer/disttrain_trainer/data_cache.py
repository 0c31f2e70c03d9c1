"""The data cache: a directory built once, atomically, whichever rank gets there first.

Several ranks (and restarted gangs) may build the same entry at once: each builds into its own
temporary directory beside the target and renames it into place; the first rename wins and the
others' identical copies are dropped. A reader never sees a half-built entry.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


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
