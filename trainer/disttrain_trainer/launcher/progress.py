"""Live progress of a local run, read from rank 0's JSON-lines metrics log.

The trainer appends one JSON object per logged step to
$DISTTRAIN_RUN_DIR/metrics-rank{R}.jsonl; the launcher tails it. On a terminal
the bar redraws in place; otherwise (CI logs, pipes) it prints plain lines, at
most one per `plain_interval_s`, so logs stay readable.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

METRICS_FILE = "metrics-rank{rank}.jsonl"


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
) -> str:
    """One status line: `[#####-----] 120/500  24%  loss 0.4321  1,234 samples/s  0:12`."""
    frac = min(1.0, max(0.0, step / total)) if total > 0 else 0.0
    parts = []
    if bar:
        filled = int(round(frac * width))
        parts.append("[" + "#" * filled + "-" * (width - filled) + "]")
    parts.append(f"step {step}/{total}")
    parts.append(f"{frac * 100:3.0f}%")
    parts.append(f"loss {loss:.4f}" if loss is not None else "loss -")
    parts.append(f"{samples_per_s:,.0f} samples/s" if samples_per_s is not None else "- samples/s")
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

    def update(self, record: dict[str, Any], *, elapsed_s: float, restarts: int) -> None:
        step = int(_num(record, "step") or 0)
        line = format_progress(
            step=step,
            total=self.total,
            loss=_num(record, "loss"),
            samples_per_s=_num(record, "samples_per_s"),
            elapsed_s=elapsed_s,
            restarts=restarts,
            bar=self.tty,
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
