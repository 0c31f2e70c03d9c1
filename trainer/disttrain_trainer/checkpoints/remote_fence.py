"""Fencing of checkpoint writers on object storage: fence.py's claims, kept in the bucket.

With spec.checkpoint.uri every pod stages in a folder of its own, so fence.py's claims (files in
that folder) fence nobody off the bucket; these do, with the same rules:

    <prefix>/.fence/<generation, 12 digits>   a claim: JSON {jobUID, attempt, generation, published}

- Claiming creates the next generation's object with a conditional write (`If-None-Match: *`):
  of two writers that race for a generation, the store lets one create it and refuses the other
  (412), which looks again. The store must support conditional writes (AWS S3 does since 2024,
  as do MinIO and moto); one that ignores the header would let two writers hold one generation.
- A writer of the same job whose restart attempt is older than the newest claim's is refused when
  it claims (fence.Fenced).
- `check` (two HEAD requests: the next generation must not exist, this writer's own claim must)
  runs right before every commit marker written and every marker or object deleted; a writer
  that finds a newer claim raises fence.Fenced, having changed nothing.
- A claim lists the commit markers it may pick (`published`): those the claim before it could see,
  and those that claim wrote. Markers are named by the claim that wrote them
  (`step-N.claim-G.committed`, objects under `step-N/claim-G/`), so a writer never overwrites
  another claim's marker or objects, and a marker a fenced writer commits after the new claim is
  never picked nor pruned by the new writer or any later one.

Residual window, as on a volume: a check and the request after it are two requests, so a claim
that lands between them lets the old writer finish that one: a late marker stays invisible; a late
delete can remove one checkpoint older than the new claim (the new gang then resumes from the one
before).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .fence import Fenced, Writer

FENCE_DIR = ".fence"
_CLAIM = re.compile(r"^(\d{12})$")
KEEP_CLAIMS = 16  # as fence.KEEP_CLAIMS: older claims are removed, oldest first


@dataclass(frozen=True, kw_only=True)
class RemoteClaim:
    uri: str  # the prefix claimed: s3://bucket/prefix/<namespace>/<job>[/server-i]
    writer: Writer
    generation: int
    published: frozenset[str] = field(default_factory=frozenset)  # marker names it may pick

    def record(self) -> dict[str, Any]:
        return {"jobUID": self.writer.job_uid, "attempt": self.writer.attempt, "generation": self.generation}

    def describe(self) -> str:
        return f"attempt {self.writer.attempt} (claim {self.generation} on the bucket)"


_claims: dict[str, RemoteClaim] = {}
_lock = threading.Lock()


def _claim_key(uri: str, generation: int) -> str:
    return f"{uri}/{FENCE_DIR}/{generation:012d}"


def _generations(fs: Any, uri: str) -> list[int]:
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{uri}/{FENCE_DIR}", detail=False, refresh=True)]
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if _CLAIM.match(n))


def _read_claim(fs: Any, uri: str, generation: int) -> dict[str, Any]:
    try:
        body = json.loads(fs.cat_file(_claim_key(uri, generation)))
    except (FileNotFoundError, ValueError):
        return {}  # unreadable: its writer is unknown, so it cannot refuse anyone
    return body if isinstance(body, dict) else {}


def claim(fs: Any, uri: str, writer: Writer, *, markers: Callable[[], Iterable[tuple[str, int]]]) -> RemoteClaim:
    """Become the newest writer of the prefix `uri`; raises Fenced when a newer attempt of the same
    job claimed it already. `markers()`: (name, generation of the claim that wrote it) of every
    commit marker present."""
    while True:
        gens = _generations(fs, uri)
        newest = gens[-1] if gens else 0
        last = _read_claim(fs, uri, newest) if newest else {}
        if last and writer.job_uid and last.get("jobUID") == writer.job_uid \
                and int(last.get("attempt", -1)) > writer.attempt:  # fmt: skip
            raise Fenced(
                f"checkpoint prefix {uri} was claimed by restart attempt {last['attempt']} of this job; this "
                f"process (attempt {writer.attempt}) belongs to a replaced gang and writes nothing"
            )
        present = list(markers())
        if newest and isinstance(last.get("published"), list):
            before = set(last["published"])
            published = frozenset(n for n, g in present if n in before or g == newest)
        else:  # no claim before (or an unreadable one): every committed checkpoint present
            published = frozenset(n for n, _ in present)
        new = RemoteClaim(uri=uri, writer=writer, generation=newest + 1, published=published)
        body = json.dumps({**new.record(), "published": sorted(published)}).encode()
        try:
            fs.pipe_file(_claim_key(uri, new.generation), body, IfNoneMatch="*")
        except FileExistsError:
            continue  # another writer took this generation between our listing and the write: look again
        for old in gens:
            if old < new.generation - KEEP_CLAIMS:
                try:
                    fs.rm_file(_claim_key(uri, old))
                except FileNotFoundError:
                    pass
        with _lock:
            _claims[uri] = new
        return new


def held(uri: str) -> RemoteClaim | None:
    with _lock:
        return _claims.get(uri)


def release(uri: str) -> None:
    """Forget this process's claim on `uri` (tests that play two writers in one process)."""
    with _lock:
        _claims.pop(uri, None)


def check(fs: Any, uri: str, action: str) -> RemoteClaim:
    """Raise Fenced unless this process holds a claim on `uri` that is still the newest."""
    mine = held(uri)
    if mine is None:
        raise Fenced(f"refused to {action} in {uri}: this process never claimed the prefix")
    if fs.exists(_claim_key(uri, mine.generation + 1)):
        other = _read_claim(fs, uri, mine.generation + 1)
        raise Fenced(
            f"refused to {action} in {uri}: restart attempt {other.get('attempt', '?')} claimed the checkpoint "
            f"prefix after this writer ({mine.describe()}); this process belongs to a replaced gang"
        )
    if not fs.exists(_claim_key(uri, mine.generation)):
        raise Fenced(
            f"refused to {action} in {uri}: this writer's claim ({mine.describe()}) is gone, removed by newer "
            "writers or with the prefix; this process belongs to a replaced gang"
        )
    return mine


def visible(uri: str, marker: str, generation: int) -> bool:
    """Whether this process may pick or prune the checkpoint of commit marker `marker`, written by
    claim `generation`: listed by its claim, or its own. Without a claim every one is (a reader)."""
    mine = held(uri)
    return mine is None or marker in mine.published or generation == mine.generation
