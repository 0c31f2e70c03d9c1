"""Checkpoints on object storage (spec.checkpoint.uri): the local checkpoint directory is staging,
the bucket is the truth.

    s3://bucket/prefix/<job>/step-XXXXXXXX/<files>      the objects of one checkpoint
    s3://bucket/prefix/<job>/step-XXXXXXXX.committed    its commit marker: JSON {step, files: {name: bytes}}

The writers (whole.py, sharded.py) write and publish a checkpoint in the local directory as
always; then its files are uploaded (every rank its own shards, for DCP), and only after every
upload finished is the marker written. A checkpoint without a marker does not exist: a writer that
died mid-upload leaves objects nobody picks. Retention deletes the marker first, then the objects,
so a half-deleted checkpoint is never picked either.

Before a writer claims its directory (directory.take_over) the local directory is made to match
the bucket: local checkpoints without a marker are dropped, committed ones missing locally are
downloaded (each object's size checked against the marker; one that does not match, a truncated
object, is skipped with a warning, so the gang falls back to the previous committed checkpoint;
one that downloads but does not load is moved aside locally as always, with the same result).
Other ranks that find the agreed checkpoint missing locally (their own pod) download it
(`ensure_local`). Fencing (fence.py) covers the local directory only: a writer of a replaced gang
on another pod is not fenced off from the bucket.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disttrain_api import constants as C

from ..data.object_store import Store, check_bucket, explain, store_for

MARKER_SUFFIX = ".committed"
_MARKER = re.compile(r"^(step-\d{8,})\.committed$")
FIELD = "spec.checkpoint.uri"


@dataclass(frozen=True, kw_only=True)
class Remote:
    store: Store
    uri: str  # s3://bucket/prefix/<job>/ ... of one local checkpoint directory, no slash at the end

    def of(self, name: str) -> str:
        return f"{self.uri}/{name}"


_ATTACHED: dict[Path, Remote] = {}


def attach(root: Path, remote: Remote) -> None:
    """Mirror the checkpoint directory `root` (and every directory below it) to `remote`."""
    _ATTACHED[root.resolve()] = remote


def detach(root: Path) -> None:
    _ATTACHED.pop(root.resolve(), None)


def remote_for(root: Path) -> Remote | None:
    """The bucket location of checkpoint directory `root`, None when it is not mirrored."""
    if not _ATTACHED:
        return None
    here = root.resolve()
    for base, remote in _ATTACHED.items():
        if here == base:
            return remote
        if base in here.parents:
            return Remote(store=remote.store, uri=f"{remote.uri}/{here.relative_to(base).as_posix()}")
    return None


def _fail(e: BaseException, remote: Remote, uri: str) -> BaseException:
    return explain(e, uri, FIELD, remote.store)


def committed(remote: Remote) -> list[str]:
    """Names (step-XXXXXXXX) of the committed checkpoints, oldest first."""
    fs = remote.store.filesystem()
    try:
        listing = fs.ls(remote.uri, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.uri) from None
    names = [m.group(1) for p in listing if (m := _MARKER.match(p.rsplit("/", 1)[-1]))]
    return sorted(names, key=lambda n: int(n.split("-", 1)[1]))


def _marker(remote: Remote, name: str) -> dict[str, Any] | None:
    try:
        body = json.loads(remote.store.filesystem().cat_file(remote.of(name + MARKER_SUFFIX)))
    except FileNotFoundError:
        return None  # pruned meanwhile
    except ValueError:
        print(f"disttrain-trainer: skipping checkpoint {remote.of(name)}: its commit marker is not JSON", flush=True)
        return None
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.of(name)) from None
    return body if isinstance(body, dict) and isinstance(body.get("files"), dict) else None


def _download(remote: Remote, root: Path, name: str, files: dict[str, int]) -> bool:
    """Checkpoint `name` into root/name (atomically); False when an object is missing or of the wrong size."""
    fs = remote.store.filesystem()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-download-{name}-", dir=root))
    try:
        for file, size in sorted(files.items()):
            src = remote.of(f"{name}/{file}")
            try:
                fs.get_file(src, str(tmp / file))
            except FileNotFoundError:
                print(f"disttrain-trainer: skipping committed checkpoint {remote.of(name)}: {file} is missing",
                      flush=True)  # fmt: skip
                return False
            except Exception as e:  # noqa: BLE001
                raise _fail(e, remote, src) from None
            got = (tmp / file).stat().st_size
            if got != int(size):
                print(f"disttrain-trainer: skipping committed checkpoint {remote.of(name)}: {file} has {got} bytes, "
                      f"its commit marker says {size} (a truncated or replaced object)", flush=True)  # fmt: skip
                return False
        try:
            os.rename(tmp, root / name)
        except OSError:  # another local rank downloaded it first: its copy is the same
            pass
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sync_down(root: Path) -> None:
    """Make the local directory match the bucket: drop checkpoints that were never committed,
    download the committed ones it lacks. Called before the directory is claimed."""
    remote = remote_for(root)
    if remote is None:
        return
    root.mkdir(parents=True, exist_ok=True)
    names = committed(remote)
    wanted = set(names)
    for child in root.iterdir():
        if re.match(r"^step-\d{8,}$", child.name) and child.is_dir() and child.name not in wanted:
            shutil.rmtree(child, ignore_errors=True)  # published here, never committed there
    for name in reversed(names):
        if (root / name).is_dir():
            continue
        marker = _marker(remote, name)
        if marker is not None:
            _download(remote, root, name, marker["files"])


def ensure_local(root: Path, name: str) -> None:
    """Checkpoint `name` that the gang agreed on, downloaded unless this pod has it already."""
    remote = remote_for(root)
    if remote is None or (root / name).is_dir():
        return
    root.mkdir(parents=True, exist_ok=True)
    marker = _marker(remote, name)
    if marker is None or not _download(remote, root, name, marker["files"]):
        raise RuntimeError(f"checkpoint {remote.of(name)} that rank 0 loaded cannot be downloaded here")


def upload(root: Path, source: Path, name: str, files: list[str]) -> dict[str, int]:
    """Objects of checkpoint `name` from the local folder `source`; returns {file: bytes}. A marker of
    the same step (a re-save) is removed first: its objects are about to change."""
    remote = remote_for(root)
    if remote is None:
        return {}
    fs = remote.store.filesystem()
    try:
        if fs.exists(remote.of(name + MARKER_SUFFIX)):
            fs.rm_file(remote.of(name + MARKER_SUFFIX))
        sizes = {}
        for file in files:
            fs.put_file(str(source / file), remote.of(f"{name}/{file}"))
            sizes[file] = (source / file).stat().st_size
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.of(name)) from None
    return sizes


def commit(root: Path, name: str, files: dict[str, int], keep: int) -> None:
    """Write checkpoint `name`'s marker (all of its objects are uploaded), then prune to the newest `keep`."""
    remote = remote_for(root)
    if remote is None:
        return
    fs = remote.store.filesystem()
    body = json.dumps({"step": int(name.split("-", 1)[1]), "files": files}).encode()
    try:
        fs.pipe_file(remote.of(name + MARKER_SUFFIX), body)
        for old in committed(remote)[:-keep] if keep > 0 else []:
            if old == name:
                continue
            fs.rm_file(remote.of(old + MARKER_SUFFIX))  # first: from now on nobody picks it
            fs.rm(remote.of(old), recursive=True)
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.of(name)) from None


def publish(root: Path, final: Path, keep: int) -> None:
    """A checkpoint one process wrote whole (whole.py), published locally: upload, commit, prune."""
    if remote_for(root) is None:
        return
    files = sorted(f.name for f in final.iterdir() if f.is_file())
    commit(root, final.name, upload(root, final, final.name, files), keep)


def export_upload_order(names: list[str]) -> list[str]:
    """model.json last: it names the weights, so a reader that finds it finds a whole export
    (a Hugging Face directory also holds config and tokenizer .json files that sort after it)."""
    return sorted(names, key=lambda n: (n == C.EXPORT_SPEC_FILENAME, n))


def upload_export(root: Path, folder: Path) -> str | None:
    """The exported model (weights/export.py) copied to <uri>/<job>/export/: its URI, None when the
    checkpoints are not mirrored. The weights go first, model.json (what names them) last."""
    remote = remote_for(root)
    if remote is None:
        return None
    fs = remote.store.filesystem()
    target = remote.of(folder.name)
    files = [folder / n for n in export_upload_order([f.name for f in folder.iterdir() if f.is_file()])]
    try:
        for f in files:
            fs.put_file(str(f), f"{target}/{f.name}")
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, target) from None
    return target


def attach_spec(spec: Any, job: str, root: Path) -> None:
    """spec.checkpoint.uri: `root` (the job's checkpoint directory) becomes staging for
    <uri>/<job>; the bucket and the credentials are checked now, before anything trains."""
    uri = spec.checkpoint.uri
    if not uri:
        return
    store = store_for(spec)
    check_bucket(store, uri, FIELD)
    attach(root, Remote(store=store, uri=f"{uri.rstrip('/')}/{job}"))
