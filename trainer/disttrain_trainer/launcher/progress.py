"""Live progress of a local run, read from rank 0's JSON-lines metrics log.

The trainer appends one JSON object per logged step to
$DISTTRAIN_RUN_DIR/metrics-rank{R}.jsonl; the launcher tails it. On a terminal
the bar redraws in place; otherwise (CI logs, pipes) it prints plain lines, at
most one per `plain_interval_s`, so logs stay readable.

`ProgressRecord` turns the same records into the block the operator writes to a job's
status.progress (disttrain_api.progress: recent rate, samples/s, ETA) and keeps it in the run
dir's progress.json, rewritten at most once per PROGRESS_INTERVAL_S like the status.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from disttrain_api import constants as C
from disttrain_api import progress as job_progress
from disttrain_api.model import JobSpec

METRICS_FILE = C.RANK_METRICS_FILENAME
PROGRESS_FILE = "progress.json"


def metrics_path(run_dir: Path, rank: int = 0) -> Path:
    return run_dir / METRICS_FILE.format(rank=rank)


class JsonlTail:
    """Incremental reader of a JSON-lines file that another process appends to."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self._offset:  # truncated (a fresh attempt rewrote it): start over
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        self._offset += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")  # the last piece may be half-written
        records: list[dict[str, Any]] = []
        for line in complete:
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a torn line from a killed writer
            if isinstance(obj, dict):
                records.append(obj)
        return records


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return JsonlTail(path).read_new()


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _num(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def format_progress(
    *,
    step: int,
    total: int,
    loss: float | None,
    samples_per_s: float | None,
    elapsed_s: float,
    restarts: int = 0,
    width: int = 24,
    bar: bool = True,
    eta: str | None = None,
) -> str:
    """One status line: `[#####-----] 120/500  24%  loss 0.4321  1,234 samples/s  ETA 0:48  0:12`."""
    frac = min(1.0, max(0.0, step / total)) if total > 0 else 0.0
    parts = []
    if bar:
        filled = int(round(frac * width))
        parts.append("[" + "#" * filled + "-" * (width - filled) + "]")
    parts.append(f"step {step}/{total}")
    parts.append(f"{frac * 100:3.0f}%")
    parts.append(f"loss {loss:.4f}" if loss is not None else "loss -")
    parts.append(f"{samples_per_s:,.0f} samples/s" if samples_per_s is not None else "- samples/s")
    if eta is not None:
        parts.append(f"ETA {eta}")
    if restarts:
        parts.append(f"restarts {restarts}")
    parts.append(_fmt_duration(elapsed_s))
    return "  ".join(parts)


class ProgressPrinter:
    def __init__(
        self,
        stream: TextIO,
        *,
        total: int,
        tty: bool | None = None,
        plain_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream
        self.total = total
        self.tty = stream.isatty() if tty is None else tty
        self.plain_interval_s = plain_interval_s
        self._clock = clock
        self._last_plain = float("-inf")
        self._last_line = ""
        self._pending = ""
        self._drawn = False

    def update(self, record: dict[str, Any], *, elapsed_s: float, restarts: int,
               progress: dict[str, Any] | None = None) -> None:  # fmt: skip
        """`progress`: the status.progress block (ProgressRecord); its job-wide samples/s and its
        ETA replace rank 0's own samples/s once it has a rate."""
        step = int(_num(record, "step") or 0)
        samples = _num(progress, "samplesPerSecond") if progress else None
        line = format_progress(
            step=step,
            total=self.total,
            loss=_num(record, "loss"),
            samples_per_s=samples if samples is not None else _num(record, "samples_per_s"),
            elapsed_s=elapsed_s,
            restarts=restarts,
            bar=self.tty,
            eta=progress.get("eta") if progress else None,
        )
        if self.tty:
            columns = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r" + line[: columns - 1].ljust(len(self._last_line)))
            self._drawn = True
            self.stream.flush()
            self._last_line = line
            return
        now = self._clock()
        if now - self._last_plain >= self.plain_interval_s or step >= self.total:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_plain = now
            self._pending = ""
        else:
            self._pending = line  # printed by finish() so the last state is never lost

    def status(self, text: str) -> None:
        """A transient line (e.g. while the processes start); only on a terminal, where it is redrawn."""
        if not self.tty:
            return
        self.stream.write("\r" + text.ljust(len(self._last_line)))
        self.stream.flush()
        self._drawn = True
        self._last_line = text

    def note(self, message: str) -> None:
        """A message on its own line (restarts, warnings) without garbling the bar."""
        if self.tty and self._drawn:
            self.stream.write("\r" + " " * len(self._last_line) + "\r")
        self.stream.write(message + "\n")
        if self.tty and self._drawn:
            self.stream.write(self._last_line)
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
        elif self._pending:
            self.stream.write(self._pending + "\n")
            self._pending = ""
        self.stream.flush()
        self._drawn = False


class ProgressRecord:
    """status.progress of a local run: rank 0's step records through the operator's arithmetic,
    kept in `path` (the run dir's progress.json) at most once per `interval_s` and at the end."""

    def __init__(self, spec: JobSpec, path: Path, *, interval_s: float = job_progress.PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.basis = job_progress.basis_for(spec)
        self.path, self.interval_s, self._clock = path, interval_s, clock
        self.block: dict[str, Any] | None = None
        self._written = float("-inf")

    def update(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Fold one step record (its step, the time the trainer wrote it, its MFU) in."""
        step, at = _num(record, "step"), _num(record, "time")
        if step is None:
            return self.block
        now = datetime.fromtimestamp(at, UTC) if at is not None else datetime.now(UTC)
        self.block = job_progress.build(self.block, completed=int(step), basis=self.basis, now=now,
                                        mfu=_num(record, "mfu"), finish_s=_num(record, "finish_s"))  # fmt: skip
        if self._clock() - self._written >= self.interval_s:
            self._write()
        return self.block

    def restarted(self) -> None:
        """A new gang starts: its first record starts the next rate window (job_progress.restarted)."""
        self.block = job_progress.restarted(self.block)

    def finish(self, *, succeeded: bool, result: dict[str, Any] | None) -> dict[str, Any] | None:
        """The last block: a succeeded run's is done (100 %, the trainer's own throughput)."""
        if succeeded:
            self.block = job_progress.finished(self.block, completed=self.basis.total, basis=self.basis,
                                               now=datetime.now(UTC), result=result)  # fmt: skip
        if self.block is not None:
            self._write()
        return self.block

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.block, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
        self._written = self._clock()
