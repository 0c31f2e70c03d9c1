"""Checkpoints on object storage (spec.checkpoint.uri): the local checkpoint directory is staging,
the bucket is the truth.

    s3://bucket/prefix/<namespace>/<job>/step-XXXXXXXX.claim-G.committed   commit marker: JSON {step, files, writer}
    s3://bucket/prefix/<namespace>/<job>/step-XXXXXXXX/claim-G/<files>     its objects
    s3://bucket/prefix/<namespace>/<job>/.fence/<generation>               the writers' claims (remote_fence.py)
    s3://bucket/prefix/<namespace>/<job>/export/                           the exported model

G is the generation of the writer's claim on the prefix: a writer only ever creates objects under
its own claim's names, so a writer of a replaced gang can neither overwrite the new gang's markers
nor its objects, and every commit, marker removal and prune checks the claim first (fenced like the
local directory: remote_fence.py). Markers written before claims existed (`step-XXXXXXXX.committed`,
objects directly under `step-XXXXXXXX/`) are read as generation 0.

The writers (whole.py, sharded.py) write and publish a checkpoint in the local directory as
always; then its files are uploaded (every rank its own shards, for DCP), and only after every
upload finished is the marker written. A checkpoint without a marker does not exist: a writer that
died mid-upload leaves objects nobody picks. Retention deletes the marker first, then the objects,
so a half-deleted checkpoint is never picked either.

Before a writer reads anything (directory.take_over) it claims the prefix, then the local directory
is made to match what the claim may pick: local checkpoints without such a marker are dropped,
committed ones missing locally are downloaded (each object's size checked against the marker; one
that does not match, a truncated object, is skipped with a warning, so the gang falls back to the
previous committed checkpoint; one that downloads but does not load is moved aside locally as
always, with the same result). Other ranks that find the agreed checkpoint missing locally (their
own pod) download the very marker rank 0 took (`ensure_local`). A marker's file names come from
the bucket: one that is not a plain file name (`..`, a slash, absolute) is refused, naming the key.
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

from ..data.object_store import Store, StoreUnreachable, check_bucket, explain, store_for
from ..process.config import ConfigError
from ..process.safe_paths import problem as path_problem
from . import remote_fence
from .fence import Fenced, Writer

_MARKER = re.compile(r"^(step-\d{8,})(?:\.claim-(\d+))?\.committed$")
_STEP = re.compile(r"^step-\d{8,}$")
FIELD = "spec.checkpoint.uri"


@dataclass(frozen=True, kw_only=True)
class Remote:
    store: Store
    uri: str  # s3://bucket/prefix/<namespace>/<job> ... of one local checkpoint directory, no slash at the end

    def of(self, name: str) -> str:
        return f"{self.uri}/{name}"


@dataclass(frozen=True, order=True)
class Marker:
    """A commit marker: checkpoint `step_name` as claim `generation` wrote it (0: before claims)."""

    step_name: str
    generation: int

    @property
    def step(self) -> int:
        return int(self.step_name.split("-", 1)[1])

    @property
    def name(self) -> str:
        suffix = f".claim-{self.generation}" if self.generation else ""
        return f"{self.step_name}{suffix}.committed"

    @property
    def folder(self) -> str:
        return f"{self.step_name}/claim-{self.generation}" if self.generation else self.step_name


def parse_marker(name: str) -> Marker | None:
    m = _MARKER.match(name)
    return Marker(m.group(1), int(m.group(2) or 0)) if m else None


_ATTACHED: dict[Path, Remote] = {}
# root -> {step name: the marker its local copy came from}: what rank 0 tells the other ranks to fetch.
_SOURCES: dict[Path, dict[str, str]] = {}


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


def markers(remote: Remote) -> list[Marker]:
    """Every commit marker present, whoever wrote it, oldest step first."""
    fs = remote.store.filesystem()
    try:
        listing = fs.ls(remote.uri, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.uri) from None
    return sorted(m for p in listing if (m := parse_marker(p.rsplit("/", 1)[-1])) is not None)


def _visible(remote: Remote) -> list[Marker]:
    return [m for m in markers(remote) if remote_fence.visible(remote.uri, m.name, m.generation)]


def committed(remote: Remote) -> list[Marker]:
    """The committed checkpoints this process may pick, oldest first: for each step the marker of the
    newest claim among those its own claim may see (remote_fence.visible)."""
    newest: dict[str, Marker] = {}
    for m in _visible(remote):
        newest[m.step_name] = max(newest.get(m.step_name, m), m)
    return sorted(newest.values())


def _marker_files(remote: Remote, marker: Marker) -> dict[str, int] | None:
    """The marker's {file: bytes}; None (with a line in the log) when it is gone, not JSON, or names
    a file that is not a plain name in the checkpoint's folder."""
    key = remote.of(marker.name)
    try:
        body = json.loads(remote.store.filesystem().cat_file(key))
    except FileNotFoundError:
        return None  # pruned meanwhile
    except ValueError:
        print(f"disttrain-trainer: skipping checkpoint {key}: its commit marker is not JSON", flush=True)
        return None
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, key) from None
    files = body.get("files") if isinstance(body, dict) else None
    if not isinstance(files, dict):
        return None
    for name in files:
        why = path_problem(str(name), flat=True)
        if why is not None:
            print(f"disttrain-trainer: skipping checkpoint {key}: its commit marker lists {name!r}, which {why}: "
                  f"it would be written outside the checkpoint's folder; refused", flush=True)  # fmt: skip
            return None
    try:
        return {str(k): int(v) for k, v in files.items()}
    except (TypeError, ValueError):
        print(f"disttrain-trainer: skipping checkpoint {key}: its commit marker's sizes are not numbers", flush=True)
        return None


def _download(remote: Remote, root: Path, marker: Marker, files: dict[str, int]) -> bool:
    """Checkpoint `marker` into root/<step> (atomically); False when an object is missing or of the wrong size."""
    fs = remote.store.filesystem()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-download-{marker.step_name}-", dir=root))
    try:
        for file, size in sorted(files.items()):
            src = remote.of(f"{marker.folder}/{file}")
            try:
                fs.get_file(src, str(tmp / file))
            except FileNotFoundError:
                print(f"disttrain-trainer: skipping committed checkpoint {remote.of(marker.name)}: {file} is missing",
                      flush=True)  # fmt: skip
                return False
            except Exception as e:  # noqa: BLE001
                raise _fail(e, remote, src) from None
            got = (tmp / file).stat().st_size
            if got != int(size):
                print(f"disttrain-trainer: skipping committed checkpoint {remote.of(marker.name)}: {file} has {got} "
                      f"bytes, its commit marker says {size} (a truncated or replaced object)", flush=True)  # fmt: skip
                return False
        try:
            os.rename(tmp, root / marker.step_name)
        except OSError:  # another local rank downloaded it first: its copy is the same
            pass
        _SOURCES.setdefault(root.resolve(), {})[marker.step_name] = marker.name
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def take_over(root: Path, writer: Writer) -> None:
    """A writer's first step with a mirrored `root`: claim its prefix (remote_fence.claim; raises
    Fenced when a newer attempt holds it), then make `root` match what the claim may pick."""
    remote = remote_for(root)
    if remote is None:
        return
    _claim(remote, writer)
    sync_down(root)


def _claim(remote: Remote, writer: Writer) -> remote_fence.RemoteClaim:
    try:
        return remote_fence.claim(remote.store.filesystem(), remote.uri, writer,
                                  markers=lambda: [(m.name, m.generation) for m in markers(remote)])  # fmt: skip
    except (Fenced, ConfigError, StoreUnreachable):
        raise
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.uri) from None


def sync_down(root: Path) -> None:
    """Make the local directory match the bucket: drop checkpoints that were never committed (or that
    this process may not pick), download the committed ones it lacks."""
    remote = remote_for(root)
    if remote is None:
        return
    root.mkdir(parents=True, exist_ok=True)
    wanted = committed(remote)
    names = {m.step_name for m in wanted}
    for child in root.iterdir():
        if _STEP.match(child.name) and child.is_dir() and child.name not in names:
            shutil.rmtree(child, ignore_errors=True)  # published here, never committed there
    sources = _SOURCES.setdefault(root.resolve(), {})
    for marker in reversed(wanted):
        local = root / marker.step_name
        if local.is_dir() and sources.get(marker.step_name) == marker.name:
            continue  # this process committed or fetched that very copy
        files = _marker_files(remote, marker)
        if files is None:
            continue
        if local.is_dir():
            if all((local / f).is_file() and (local / f).stat().st_size == n for f, n in files.items()):
                sources[marker.step_name] = marker.name
                continue
            shutil.rmtree(local, ignore_errors=True)  # another copy than the one committed: fetch that one
        _download(remote, root, marker, files)


def source_of(root: Path, step_name: str) -> str | None:
    """The commit marker this process's copy of `step_name` came from (None when not mirrored)."""
    return _SOURCES.get(root.resolve(), {}).get(step_name) if remote_for(root) is not None else None


def ensure_local(root: Path, step_name: str, marker_name: str | None) -> None:
    """Checkpoint `step_name` that the gang agreed on, downloaded from rank 0's marker `marker_name`
    unless this pod has it already."""
    remote = remote_for(root)
    if remote is None or (root / step_name).is_dir():
        return
    root.mkdir(parents=True, exist_ok=True)
    marker = parse_marker(marker_name or "")
    files = _marker_files(remote, marker) if marker is not None and marker.step_name == step_name else None
    if marker is None or files is None or not _download(remote, root, marker, files):
        raise RuntimeError(f"checkpoint {remote.of(step_name)} ({marker_name}) that rank 0 loaded cannot be "
                           "downloaded here")  # fmt: skip


def _check(remote: Remote, action: str) -> remote_fence.RemoteClaim:
    """This process's claim on the prefix, still the newest (made now, with the env contract's
    identity, if it has none: a writer should claim first, see take_over)."""
    if remote_fence.held(remote.uri) is None:
        _claim(remote, Writer.from_env())
    try:
        return remote_fence.check(remote.store.filesystem(), remote.uri, action)
    except Fenced:
        raise
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.uri) from None


def prepare(root: Path, name: str) -> str | None:
    """Before checkpoint `name`'s objects are uploaded (one process): the folder they go to, this
    claim's; its own marker of the same step removed first (a re-save: its objects are about to
    change). None when `root` is not mirrored. Raises Fenced when a newer writer claimed the prefix."""
    remote = remote_for(root)
    if remote is None:
        return None
    marker = Marker(name, _check(remote, f"upload {name}").generation)
    fs = remote.store.filesystem()
    try:
        if fs.exists(remote.of(marker.name)):
            fs.rm_file(remote.of(marker.name))
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.of(marker.name)) from None
    return marker.folder


def upload(root: Path, source: Path, folder: str, files: list[str]) -> dict[str, int]:
    """Objects `folder`/<file> (folder: `prepare`'s) from the local folder `source`; returns {file: bytes}.
    Any rank of the writer's gang: the objects land under the writer's claim, nobody else's."""
    remote = remote_for(root)
    if remote is None:
        return {}
    fs = remote.store.filesystem()
    sizes = {}
    try:
        for file in files:
            fs.put_file(str(source / file), remote.of(f"{folder}/{file}"))
            sizes[file] = (source / file).stat().st_size
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.of(folder)) from None
    return sizes


def commit(root: Path, name: str, files: dict[str, int], keep: int) -> None:
    """Write checkpoint `name`'s marker (all of its objects are uploaded), then prune to the newest `keep`.
    Raises Fenced, having written nothing, when a newer writer claimed the prefix."""
    remote = remote_for(root)
    if remote is None:
        return
    fs = remote.store.filesystem()
    mine = _check(remote, f"commit {name}")
    marker = Marker(name, mine.generation)
    body = json.dumps({"step": marker.step, "files": files, "writer": mine.record()}).encode()
    try:
        fs.pipe_file(remote.of(marker.name), body, IfNoneMatch="*")
    except FileExistsError:  # only this claim writes its markers, and prepare removed it
        _check(remote, f"commit {name}")
        raise RuntimeError(f"{remote.of(marker.name)} appeared while its objects were uploaded") from None
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, remote.of(marker.name)) from None
    _SOURCES.setdefault(root.resolve(), {})[name] = marker.name
    _prune(remote, keep, protect=marker)


def _prune(remote: Remote, keep: int, *, protect: Marker) -> None:
    """Delete the checkpoints this claim may prune (remote_fence.visible) beyond the newest `keep`
    steps, and the older claims' copies of the steps it keeps; marker first, then the objects."""
    if keep <= 0:
        return
    fs = remote.store.filesystem()
    present = markers(remote)
    kept = {m.step_name: m for m in committed(remote)}
    kept[protect.step_name] = protect
    steps = sorted(kept, key=lambda n: int(n.split("-", 1)[1]))[-keep:]
    if protect.step_name not in steps:
        steps.append(protect.step_name)
    doomed = [m for m in present if remote_fence.visible(remote.uri, m.name, m.generation)
              and not (m.step_name in steps and kept[m.step_name] == m)]  # fmt: skip
    for m in doomed:
        _check(remote, f"prune {m.name}")
        try:
            fs.rm_file(remote.of(m.name))  # first: from now on nobody picks it
            if m.generation:
                fs.rm(remote.of(m.folder), recursive=True)
            else:  # before claims: the objects lie directly in the step's folder, beside newer claims' folders
                for file in _legacy_files(fs, remote, m):
                    fs.rm_file(remote.of(f"{m.folder}/{file}"))
            present.remove(m)
            if not any(p.step_name == m.step_name for p in present):  # leftovers of uploads never committed
                fs.rm(remote.of(m.step_name), recursive=True)
        except FileNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001
            raise _fail(e, remote, remote.of(m.name)) from None


def _legacy_files(fs: Any, remote: Remote, marker: Marker) -> list[str]:
    try:
        listing = fs.ls(remote.of(marker.folder), detail=True, refresh=True)
    except FileNotFoundError:
        return []
    return [p["name"].rsplit("/", 1)[-1] for p in listing if p.get("type") == "file"]


def publish(root: Path, final: Path, keep: int) -> None:
    """A checkpoint one process wrote whole (whole.py), published locally: upload, commit, prune."""
    folder = prepare(root, final.name)
    if folder is None:
        return
    files = sorted(f.name for f in final.iterdir() if f.is_file())
    commit(root, final.name, upload(root, final, folder, files), keep)


def export_upload_order(names: list[str]) -> list[str]:
    """model.json last: it names the weights, so a reader that finds it finds a whole export
    (a Hugging Face directory also holds config and tokenizer .json files that sort after it)."""
    return sorted(names, key=lambda n: (n == C.EXPORT_SPEC_FILENAME, n))


def upload_export(root: Path, folder: Path) -> str | None:
    """The exported model (weights/export.py) copied to <uri>/<namespace>/<job>/export/: its URI, None
    when the checkpoints are not mirrored. The weights go first, model.json (what names them) last."""
    remote = remote_for(root)
    if remote is None:
        return None
    _check(remote, "upload the export")
    fs = remote.store.filesystem()
    target = remote.of(folder.name)
    files = [folder / n for n in export_upload_order([f.name for f in folder.iterdir() if f.is_file()])]
    try:
        for f in files:
            fs.put_file(str(f), f"{target}/{f.name}")
    except Exception as e:  # noqa: BLE001
        raise _fail(e, remote, target) from None
    return target


def prefix(uri: str, namespace: str, job: str) -> str:
    """Where a job's checkpoints go under spec.checkpoint.uri: jobs of one name in two namespaces
    never share a prefix."""
    return f"{uri.rstrip('/')}/{namespace}/{job}"


def attach_spec(spec: Any, *, namespace: str, job: str, root: Path) -> None:
    """spec.checkpoint.uri: `root` (the job's checkpoint directory) becomes staging for
    <uri>/<namespace>/<job>; the bucket and the credentials are checked now, before anything trains."""
    uri = spec.checkpoint.uri
    if not uri:
        return
    store = store_for(spec)
    check_bucket(store, uri, FIELD)
    attach(root, Remote(store=store, uri=prefix(uri, namespace, job)))
