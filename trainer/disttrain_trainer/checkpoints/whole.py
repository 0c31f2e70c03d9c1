"""Checkpoints that rank 0 writes whole: `step-XXXXXXXX/` with `state.pt` (the full, unsharded
state, so it loads at any world size) and `meta.json`, in the directory layout of checkpoints/directory.py
(atomic publish, atomic re-save, newest-k pruning, unreadable ones moved aside, writers fenced).

`load(root, step)` reads one exact step, so every rank can load the step rank 0 chose;
`load_latest` returns the newest one that loads and moves the ones that do not aside. state.pt
holds tensors and plain values only and is read weights-only (safe_state.py): a file that would
need a code-running unpickler (planted, or of an older disttrain) is refused and moved aside.

`AsyncSaver` keeps the write off the training loop: the loop pays only for a copy
of the state into host memory (`snapshot`), a background thread serialises and
writes it with `save`, and at most one write is in flight.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from disttrain_api import constants as C

from . import directory as cdir
from . import fence, remote, safe_state
from .directory import META_FILE, TMP_PREFIX, clean_partial, name_for, prune

__all__ = ["META_FILE", "STATE_FILE", "TMP_PREFIX", "AsyncSaver", "SaveResult", "clean_partial", "list_checkpoints",
           "load", "load_latest", "name_for", "prune", "save", "snapshot"]  # fmt: skip

STATE_FILE = "state.pt"
# 2: tensors and plain values only (numpy RNG state as lists); 1: the same layout, written before
# that, readable only where it happens to hold nothing else (e.g. the federated aggregator's).
FORMAT = 2
FORMATS = (1, FORMAT)


@dataclass(frozen=True, kw_only=True)
class SaveResult:
    path: Path
    bytes: int
    seconds: float


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Checkpoints of this format (state.pt) this process may pick, oldest first."""
    return [(e.step, e.path) for e in cdir.entries(root)
            if e.meta is not None and e.meta.get("format", 1) in FORMATS and (e.path / STATE_FILE).is_file()]  # fmt: skip


@contextlib.contextmanager
def _no_zip_crc() -> Iterator[None]:
    # torch.save spends about a third of a checkpoint computing zip CRC32s (measured: 41 ms
    # vs 27 ms for 17 MB). Integrity comes from temp dir + fsync + rename, and meta.json
    # records the byte count that load checks, so the CRCs buy nothing here.
    previous = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(previous)


def _write_state(path: Path, state: dict[str, Any], step: int) -> None:
    kill_at = os.environ.get(C.ENV_FAULT_KILL_IN_CHECKPOINT)
    if kill_at and int(kill_at) == step:
        # Fault injection for tests: die like a SIGKILLed pod, halfway through the bytes.
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    with open(path, "wb") as f, _no_zip_crc():
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def save(root: Path, state: dict[str, Any], step: int, *, keep: int, world_size: int) -> SaveResult:
    """Write `state` as checkpoint `step` atomically, then keep only the newest `keep`.

    Raises fence.Fenced, having changed nothing, when a newer writer claimed `root`; TypeError,
    naming the key, when `state` holds a value that is neither a tensor nor plain (safe_state.plain)."""
    start = time.perf_counter()
    state = safe_state.plain(state)
    root.mkdir(parents=True, exist_ok=True)
    mine = fence.check(root, f"write {name_for(step)}")
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{name_for(step)}-", dir=root))
    try:
        _write_state(tmp / STATE_FILE, state, step)
        nbytes = (tmp / STATE_FILE).stat().st_size
        meta = {"step": step, "world_size": world_size, "bytes": nbytes, "time": time.time(), "format": FORMAT,
                "files": cdir.manifest(tmp), "writer": mine.record()}  # fmt: skip
        (tmp / META_FILE).write_text(json.dumps(meta))
        cdir.fsync_file(tmp / META_FILE)
        cdir.fsync_dir(tmp)
        final = cdir.publish(root, tmp, step)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):  # e.g. a newer writer removed the temp dir as partial: that is Fenced
            fence.check(root, f"write {name_for(step)}")
        raise
    prune(root, keep, protect=final)
    remote.publish(root, final, keep)  # spec.checkpoint.uri: upload, then the commit marker
    return SaveResult(path=final, bytes=nbytes, seconds=time.perf_counter() - start)


def snapshot(state: Any, reuse: Any = None) -> Any:
    """A copy of `state` that training can no longer change: tensors copied to host memory,
    containers rebuilt, arrays copied; other leaves (numbers, strings, tuples of them) are immutable.

    `reuse`: an earlier snapshot of the same structure that nobody reads any more; its host
    tensors are overwritten in place instead of allocating (and page-faulting) fresh memory."""
    if isinstance(state, torch.Tensor):
        src = state.detach()
        if (isinstance(reuse, torch.Tensor) and reuse.shape == src.shape and reuse.dtype == src.dtype
                and reuse.device.type == "cpu"):  # fmt: skip
            return reuse.copy_(src)
        return src.to("cpu", copy=True)
    if isinstance(state, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {k: snapshot(v, old.get(k)) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(state) else [None] * len(state)
        out = [snapshot(v, o) for v, o in zip(state, old, strict=True)]
        return out if isinstance(state, list) else tuple(out)
    if isinstance(state, np.ndarray):
        return state.copy()
    return state


WRITE_SWITCH_INTERVAL_S = 0.0005
WRITER_NICENESS = 10


class AsyncSaver:
    """Checkpoints written by one background thread, at most one in flight.

    `save` waits for the previous write (so saves never pile up), snapshots the state on
    the caller's thread and returns; `wait` blocks until the write in flight is on disk.
    A write that failed raises its error from the next `save`, `poll` or `wait`. A process
    killed mid-write leaves only a temp dir: the newest complete checkpoint stays loadable.
    The thread is not a daemon: a trainer leaving on an error still finishes the write.
    """

    def __init__(self, root: Path, *, keep: int, world_size: int) -> None:
        self.root, self.keep, self.world_size = root, keep, world_size
        self._thread: threading.Thread | None = None
        self._spare: Any = None  # the last snapshot, once written: its buffers are reused
        self._done: list[SaveResult] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def save(self, state: dict[str, Any], step: int,
             complete: Callable[[], dict[str, Any]] | None = None) -> float:  # fmt: skip
        """Start writing checkpoint `step`; returns the seconds the caller was held up.

        `complete`: entries still on their way (a collective in flight), called on the writer
        thread and merged into the snapshot before anything is written."""
        start = time.perf_counter()
        self._join()
        snap = snapshot(state, self._spare)
        self._spare = None
        # The writer pickles with the GIL held; a training thread asking for it back waits up to
        # the switch interval (5 ms by default) at every handover. While the write is in flight
        # the interval is WRITE_SWITCH_INTERVAL_S, so the loop gets the GIL back promptly.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, WRITE_SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._write, args=(snap, step, complete, interval),
                                        name=f"checkpoint-{step}")  # fmt: skip
        self._thread.start()
        return time.perf_counter() - start

    def _write(self, state: dict[str, Any], step: int, complete: Callable[[], dict[str, Any]] | None,
               switch_interval: float) -> None:  # fmt: skip
        # Behind the training threads for the CPU: the write uses what they leave (Linux nices threads).
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        try:
            if complete is not None:
                state.update(complete())
            res = save(self.root, state, step, keep=self.keep, world_size=self.world_size)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            with self._lock:
                self._error = e
            return
        finally:
            sys.setswitchinterval(switch_interval)  # the write is over, not only once someone joins it
        with self._lock:
            self._done.append(res)
            self._spare = state

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def poll(self) -> list[SaveResult]:
        """Writes finished since the last poll (non-blocking)."""
        with self._lock:
            done, self._done = self._done, []
            error, self._error = self._error, None
        if isinstance(error, fence.Fenced):
            raise error  # not a failed write: this process must stop (see checkpoint_fence)
        if error is not None:
            raise RuntimeError(f"checkpoint write under {self.root} failed: {error}") from error
        return done

    def wait(self) -> list[SaveResult]:
        """Block until the write in flight is complete; returns the writes finished since the last poll."""
        self._join()
        return self.poll()


def load(root: Path, step: int, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Checkpoint `step` exactly; raises when it is missing, incomplete or does not load, and
    safe_state.UnsafeCheckpoint when it holds more than tensors and plain values."""
    path = root / name_for(step)
    problem = cdir.manifest_problem(path, cdir.read_meta(path))
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return safe_state.load(path / STATE_FILE, map_location)


def load_latest(
    root: Path, map_location: str | torch.device = "cpu"
) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that actually loads. One that does not is moved aside as
    `step-N.corrupt` by a writer (a process that claimed `root`) and skipped by a reader."""
    for step, path in reversed(list_checkpoints(root)):
        try:
            state = load(root, step, map_location)
        except Exception as e:  # noqa: BLE001 - a damaged file must not stop the job; an older one may load
            cdir.quarantine(path, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            continue
        return step, state
    return None
