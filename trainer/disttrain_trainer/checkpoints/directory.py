"""The checkpoint directory <root>/<job>/: how checkpoints are published, replaced, pruned and moved aside.

    step-XXXXXXXX/               a complete checkpoint: meta.json and the files its manifest lists
    step-XXXXXXXX.corrupt/       one that failed to load or verify, moved aside: never deleted,
                                 never counted toward `keep`, never picked (`.corrupt-2`, ... if taken)
    .tmp-*/                      a checkpoint being written, or left by a writer that died mid-save
    .replacing-step-XXXXXXXX/    the previous copy of a step being saved again, until the new one is in place
    .fence/                      the writers' claims (checkpoints/fence.py)

meta.json carries the step, the format (1: whole.py's state.pt; "dcp": checkpoints/sharded.py),
`files` (name -> bytes of every other file: the manifest a checkpoint is verified against) and
`writer` (the claim that wrote it). A checkpoint is written into a `.tmp-` sibling, every file and
the directory fsynced, then renamed into place (`publish`) and the parent fsynced: a crash leaves
the complete new checkpoint or none. Every rename and delete here is checked against the
writer's claim first (fence.check), so a writer of a replaced gang changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fence, remote

META_FILE = fence.META_FILE
TMP_PREFIX = ".tmp-"
REPLACING_PREFIX = ".replacing-"
CORRUPT_SUFFIX = ".corrupt"
NAME = re.compile(r"^step-(\d{8,})$")


def name_for(step: int) -> str:
    return f"step-{step:08d}"


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, kw_only=True)
class Entry:
    step: int
    path: Path
    meta: dict[str, Any] | None  # None: meta.json missing or unreadable


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def entries(root: Path) -> list[Entry]:
    """Every `step-N` directory this process may pick or prune (fence.visible), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = NAME.match(child.name)
        if m is None or not child.is_dir():
            continue
        meta = read_meta(child)
        if fence.visible(root, child.name, meta or {}):
            found.append(Entry(step=int(m.group(1)), path=child, meta=meta))
    return sorted(found, key=lambda e: e.step)


def manifest(path: Path) -> dict[str, int]:
    """Bytes of every file in checkpoint dir `path` but meta.json: what `manifest_problem` verifies."""
    return {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.is_file() and f.name != META_FILE}


def manifest_problem(path: Path, meta: dict[str, Any] | None) -> str | None:
    """Why checkpoint `path` is incomplete (a manifest file missing or of another size), or None.

    Checkpoints written before manifests existed carry only `bytes` of state.pt (format 1)."""
    if meta is None:
        return f"{META_FILE} is missing or unreadable"
    files = meta.get("files")
    if not isinstance(files, dict):
        files = {"state.pt": meta["bytes"]} if meta.get("format") == 1 and "bytes" in meta else {}
    for name, size in files.items():
        try:
            actual = (path / name).stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, {META_FILE} says {size}"
    return None


def quarantine(path: Path, reason: str) -> Path | None:
    """Move an unreadable checkpoint aside as `step-N.corrupt` (kept for a human to look at).

    Only a writer (a process holding a claim on the directory) moves it; a reader just skips it."""
    root = path.parent
    if fence.held(root) is None:
        print(f"disttrain-trainer: skipping unreadable checkpoint {path}: {reason}", flush=True)
        return None
    fence.check(root, f"move the unreadable {path.name} aside")
    target, n = root / f"{path.name}{CORRUPT_SUFFIX}", 2
    while target.exists():
        target, n = root / f"{path.name}{CORRUPT_SUFFIX}-{n}", n + 1
    try:
        os.rename(path, target)
    except FileNotFoundError:  # gone meanwhile (removed by hand, or by a writer in the fencing window)
        print(f"disttrain-trainer: skipping checkpoint {path}: {reason}; it is gone", flush=True)
        return None
    fsync_dir(root)
    print(f"disttrain-trainer: checkpoint {path} is unreadable ({reason}); moved aside to {target.name}", flush=True)
    return target


def publish(root: Path, tmp: Path, step: int) -> Path:
    """Rename the complete, fsynced checkpoint `tmp` into place as `step`.

    Saving a step that exists already replaces it without a moment with no complete copy: the
    old copy is renamed to `.replacing-step-N`, the new one into place, then the old one removed.
    A crash between the two renames leaves the old copy under `.replacing-`, and `recover` (at the
    next writer's start) puts it back."""
    final = root / name_for(step)
    aside = root / f"{REPLACING_PREFIX}{final.name}"
    fence.check(root, f"publish {final.name}")
    if not final.exists():
        os.rename(tmp, final)
        fsync_dir(root)
        if aside.exists():  # an earlier replacement of this step died before putting its copy back
            shutil.rmtree(aside, ignore_errors=True)
        return final
    if aside.exists():  # left by an earlier replacement that got its new copy in place: outdated
        shutil.rmtree(aside, ignore_errors=True)
    os.rename(final, aside)
    fsync_dir(root)
    try:
        fence.check(root, f"publish {final.name}")
    except fence.Fenced:
        os.rename(aside, final)  # undo: what this writer moved may be the newer writer's copy
        raise
    os.rename(tmp, final)
    fsync_dir(root)
    shutil.rmtree(aside, ignore_errors=True)
    return final


def recover(root: Path) -> None:
    """Finish replacements that a crash interrupted: the old copy comes back when the new one
    never got into place, and goes when it did."""
    if not root.is_dir():
        return
    for child in root.iterdir():
        if not child.name.startswith(REPLACING_PREFIX):
            continue
        final = root / child.name[len(REPLACING_PREFIX) :]
        if NAME.match(final.name) is None:
            continue
        if final.exists():
            fence.check(root, f"remove the replaced copy {child.name}")
            shutil.rmtree(child, ignore_errors=True)
        else:
            fence.check(root, f"restore {final.name}")
            os.rename(child, final)
            fsync_dir(root)
            print(f"disttrain-trainer: restored {final.name}: its replacement was interrupted", flush=True)


def clean_partial(root: Path) -> list[Path]:
    """Clean up after writers that died mid-save (call after claiming the directory): finish their
    interrupted replacements (`recover`), remove their temp dirs; returns the temp dirs removed."""
    removed = []
    recover(root)
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(TMP_PREFIX):
                fence.check(root, f"remove the partial {child.name}")
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def take_over(root: Path, writer: fence.Writer) -> fence.Claim:
    """What a writer does before it reads anything: claim the directory, finish interrupted
    replacements, remove partial writes."""
    # spec.checkpoint.uri: claim the bucket's prefix, then fetch what that claim may pick, before the
    # local claim counts what is here.
    remote.take_over(root, writer)
    mine = fence.claim(root, writer)
    clean_partial(root)
    return mine


def prune(root: Path, keep: int, *, protect: Path | None = None) -> None:
    """Keep the newest `keep` complete checkpoints (by step) and delete the older ones.

    One whose files do not match its manifest is moved aside, not counted; `protect` (the
    checkpoint just written) is always kept. Checkpoints another writer published after this
    one claimed the directory are not this writer's to delete (fence.visible)."""
    if keep <= 0:
        return
    kept = 0
    for e in reversed(entries(root)):
        if protect is not None and e.path == protect:
            kept += 1
            continue
        problem = manifest_problem(e.path, e.meta)
        if problem is not None:
            quarantine(e.path, problem)
        elif kept < keep:
            kept += 1
        else:
            fence.check(root, f"prune {e.path.name}")
            shutil.rmtree(e.path, ignore_errors=True)
