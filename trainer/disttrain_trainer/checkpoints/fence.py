"""Fencing of checkpoint writers: only the newest writer of a checkpoint directory may change it.

The operator declares a node lost after its node-lost timeout and force-deletes that node's
pods; the replacements (same pod names, the gang's next restart attempt) start while the old
processes may still run on a partitioned node that shares the checkpoint volume. An old rank 0
that goes on publishing and pruning there would replace or delete the new gang's checkpoints.
So every writer *claims* the directory before it reads or writes anything there, and checks
that its claim is still the newest right before every publish, rename and delete:

- A claim is a file `.fence/<generation>` (generations 1, 2, 3, ...) holding the writer's
  identity: the job's UID (DISTTRAIN_JOB_UID; empty for runs started by hand), its restart
  attempt (DISTTRAIN_RESTART_ATTEMPT) and the checkpoints present then that it may pick.
- Claiming writes the file under a temp name and hard-links it to the next generation. link()
  fails with EEXIST if another writer took that generation first (atomic on local file systems
  and on NFS), so two writers never hold one generation and the generations have no gaps: the
  claim after generation G is G + 1, and `check` is a stat() of `.fence/<G + 1>` (and of its
  own claim: old claims are removed oldest first, see KEEP_CLAIMS).
- A writer of the same job whose restart attempt is older than the newest claim's is refused
  when it claims: a process of a replaced gang that started late never takes over.
- Every checkpoint's meta.json names the claim that wrote it (`Claim.record`). A claim sees
  only the checkpoints that the claim before it could see and those it writes itself
  (`visible`): a checkpoint that an older writer renamed into place after a newer claim is
  never picked nor pruned, by this writer or any later one.

A writer that finds a newer claim raises `Fenced`; the process exits with exitcodes.FENCED
after one log line (it belongs to a replaced gang: its pod is gone, nobody counts the exit).

Residual window: a check and the rename or delete after it are two operations. A claim that
lands between them lets the old writer finish that one operation: a late rename stays invisible
to the new writer (see above); a late delete can remove one checkpoint older than the new
claim. On NFS the client's attribute and lookup caches can hide a new claim from the old
writer for up to the cache time (acdirmax, 60 s by default); mount shared checkpoint volumes
with `lookupcache=positive` (or `actimeo=0`) to make every check ask the server.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from disttrain_api import constants as C
from disttrain_api import exitcodes

# Fenced is raised here and caught as fence.Fenced; process/config.py defines it so that dist_env
# maps it to its exit code without importing checkpoints.
from ..process.config import Fenced, TrainerConfig

FENCE_DIR = ".fence"
META_FILE = "meta.json"  # a checkpoint's meta.json, where `writer` names the claim that wrote it
_CLAIM = re.compile(r"^(\d{12})$")
# A checkpoint present when a writer claims: `step-N`, or the old copy of a replacement that a
# crash interrupted (directory.REPLACING_PREFIX), which the claimer puts back as `step-N`.
_STEP = re.compile(r"^(?:\.replacing-)?(step-\d{8,})$")
# Claims more than this many generations below the newest are removed (oldest first). A writer
# still holding one finds its own claim gone at its next check and is fenced all the same.
KEEP_CLAIMS = 16


@dataclass(frozen=True, kw_only=True)
class Writer:
    """Who writes: the job's UID (empty when unknown) and the gang's restart attempt."""

    job_uid: str = ""
    attempt: int = 0

    @staticmethod
    def of(cfg: TrainerConfig) -> Writer:
        """Who this process's checkpoint writes are from: the job and its restart attempt."""
        return Writer(job_uid=cfg.job_uid, attempt=cfg.restart_attempt)

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> Writer:
        """For a caller that saves without claiming first: the env contract's identity."""
        env = os.environ if environ is None else environ
        raw = (env.get(C.ENV_RESTART_ATTEMPT) or "0").strip()
        return Writer(job_uid=env.get(C.ENV_JOB_UID) or "", attempt=int(raw) if raw.isdigit() else 0)


@dataclass(frozen=True, kw_only=True)
class Claim:
    root: Path
    writer: Writer
    generation: int
    published: frozenset[str] = field(default_factory=frozenset)  # checkpoints there at the claim it may pick

    def record(self) -> dict[str, Any]:
        return {"jobUID": self.writer.job_uid, "attempt": self.writer.attempt, "generation": self.generation}

    def describe(self) -> str:
        return f"attempt {self.writer.attempt} (claim {self.generation})"


_claims: dict[Path, Claim] = {}
_lock = threading.Lock()


def _key(root: Path) -> Path:
    return Path(os.path.abspath(root))


def _claim_path(root: Path, generation: int) -> Path:
    return root / FENCE_DIR / f"{generation:012d}"


def _read_claim(root: Path, generation: int) -> dict[str, Any]:
    try:
        return json.loads(_claim_path(root, generation).read_text())
    except (OSError, ValueError):
        return {}  # unreadable: its writer is unknown, so it cannot refuse anyone


def _generations(root: Path) -> list[int]:
    try:
        names = os.listdir(root / FENCE_DIR)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if _CLAIM.match(n))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_exclusive(path: Path, body: bytes) -> bool:
    """Create `path` holding `body` unless it exists (False then). Written under a temp name and
    hard-linked, so nobody reads it half-written; where the file system has no hard links, created
    with O_EXCL and then written (a reader may then see it empty: an unknown writer, still newer)."""
    tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here (EPERM, ENOTSUP): fall back to an exclusive create
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        return True
    finally:
        os.unlink(tmp)


def _carried_over(root: Path, last: dict[str, Any] | None) -> frozenset[str]:
    """The checkpoints a new claim may pick: those present that the previous claim could see (there
    when it claimed, or written under it), so a fenced writer's late rename never becomes visible to
    later claims either. Without a previous claim (or an unreadable one): every checkpoint present."""
    present = [(m.group(1), root / n) for n in os.listdir(root) if (m := _STEP.match(n))]
    if last is None or not isinstance(last.get("published"), list):
        return frozenset(name for name, _ in present)
    before = set(last["published"])
    record = {k: last.get(k) for k in ("jobUID", "attempt", "generation")}
    return frozenset(name for name, path in present if name in before or _writer_of(path) == record)


def _writer_of(path: Path) -> Any:
    try:
        return json.loads((path / META_FILE).read_text()).get("writer")
    except (OSError, ValueError, AttributeError):
        return None


def claim(root: Path, writer: Writer) -> Claim:
    """Become the newest writer of `root` (created if missing); raises Fenced when a newer
    attempt of the same job claimed it already. Call before reading or writing checkpoints."""
    fence = root / FENCE_DIR
    fence.mkdir(parents=True, exist_ok=True)
    while True:
        gens = _generations(root)
        newest = gens[-1] if gens else 0
        last = _read_claim(root, newest) if newest else {}
        if last:
            if writer.job_uid and last.get("jobUID") == writer.job_uid and int(last.get("attempt", -1)) > writer.attempt:
                raise Fenced(
                    f"checkpoint directory {root} was claimed by restart attempt {last['attempt']} of this job; "
                    f"this process (attempt {writer.attempt}) belongs to a replaced gang and writes nothing"
                )
        published = _carried_over(root, last if newest else None)
        new = Claim(root=root, writer=writer, generation=newest + 1, published=published)
        body = json.dumps({**new.record(), "published": sorted(published)}).encode()
        if not _create_exclusive(_claim_path(root, new.generation), body):
            continue  # another writer took this generation between our listing and the create: look again
        _fsync_dir(fence)
        for old in gens:
            if old < new.generation - KEEP_CLAIMS:
                _claim_path(root, old).unlink(missing_ok=True)
        with _lock:
            _claims[_key(root)] = new
        return new


def newest_attempt(root: Path) -> int:
    """The restart attempt of the newest claim on `root` (-1 when there is none)."""
    gens = _generations(root) if (root / FENCE_DIR).is_dir() else []
    return int(_read_claim(root, gens[-1]).get("attempt", -1)) if gens else -1


def held(root: Path) -> Claim | None:
    """This process's claim on `root`, if it made one."""
    with _lock:
        return _claims.get(_key(root))


def ensure_claim(root: Path) -> Claim:
    """This process's claim on `root`; made now, with the env contract's identity, if there is none
    (a writer should claim before it reads: see `claim`)."""
    return held(root) or claim(root, Writer.from_env())


def check(root: Path, action: str) -> Claim:
    """Raise Fenced unless this process's claim is still the newest; `action` names what it was
    about to do (for the log line)."""
    mine = ensure_claim(root)
    nxt = mine.generation + 1
    if _claim_path(root, nxt).exists():
        other = _read_claim(root, nxt)
        raise Fenced(
            f"refused to {action} in {root}: restart attempt {other.get('attempt', '?')} claimed the checkpoint "
            f"directory after this writer ({mine.describe()}); this process belongs to a replaced gang"
        )
    if not _claim_path(root, mine.generation).exists():
        # Claims are removed oldest first, so the next one went too: many writers came after this
        # one (or the directory was cleared under it). Either way it is not this writer's any more.
        raise Fenced(
            f"refused to {action} in {root}: this writer's claim ({mine.describe()}) is gone, removed by "
            f"newer writers or with the directory; this process belongs to a replaced gang"
        )
    return mine


def visible(root: Path, name: str, meta: dict[str, Any]) -> bool:
    """Whether this process may pick or prune checkpoint `name`: there when it claimed, or written
    under its claim. Without a claim every checkpoint is visible (a reader, not a writer)."""
    mine = held(root)
    if mine is None or name in mine.published:
        return True
    return meta.get("writer") == mine.record()


def exit_fenced(err: Fenced) -> NoReturn:
    """Log the one line and leave at once with exitcodes.FENCED (from any thread)."""
    print(f"disttrain-trainer: fenced: {err}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(exitcodes.FENCED)
