"""A DistTrainJob as `disttrain status` prints it: pure functions of the job's JSON (as the API
server returns it), its Events and the time now, so they are tested without a cluster.

`render` is the whole picture (phase, progress and ETA, restarts and disruptions, the hint,
conditions that need attention, the result when done, the last Events); `headline` is the one
line `status -w` prints each time the job moves; `event_line` one Event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from disttrain_api.progress import describe, format_eta, parse_time

TERMINAL = ("Succeeded", "Failed")
KEY_WIDTH = len("checkpoint")  # the longest row name: the values line up whichever rows a job has
# Conditions that are news only while True (the phase already says Running / Succeeded / ...).
ATTENTION = ("InvalidSpec", "NameConflict", "ChildRejected", "CheckpointsEphemeral")
# The result's figures people look for first; every other scalar follows in name order.
RESULT_FIRST = ("testAccuracy", "valLoss", "finalLoss", "steps", "rounds", "wallS", "samplesPerS", "tokensPerS",
                "mfu", "commFraction", "resumedFromStep", "device")  # fmt: skip


def _status(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job.get("status") or {})


def _spec(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job.get("spec") or {})


def ago(stamp: object, now: datetime) -> str:
    """`3m05s ago` for an RFC 3339 time; `-` when there is none."""
    when = parse_time(stamp)
    return f"{format_eta((now - when).total_seconds())} ago" if when is not None else "-"


def number(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def progress_text(job: dict[str, Any]) -> str:
    """status.progress in one line (the same words as `disttrain local`), or the bare step."""
    status = _status(job)
    block = status.get("progress")
    if isinstance(block, dict) and block.get("total"):
        return describe(block)
    steps = (_spec(job).get("training") or {}).get("steps")
    return f"step {status.get('step', 0)}/{steps}, no rate yet" if steps else f"step {status.get('step', 0)}"


def headline(job: dict[str, Any]) -> str:
    """`Running  step 120/400 (30.0%), 1,234 samples/s, ETA 4m10s  restarts 0  disruptions 0`."""
    status = _status(job)
    parts = [status.get("phase") or "Pending", progress_text(job),
             f"restarts {status.get('restarts', 0)}", f"disruptions {status.get('disruptions', 0)}"]  # fmt: skip
    return "  ".join(parts)


def result_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's scalars (the first ones people look for on top), and where the model went."""
    scalars = {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool)) and v is not None}
    order = [k for k in RESULT_FIRST if k in scalars] + sorted(k for k in scalars if k not in RESULT_FIRST)
    rows = [(k, number(scalars[k])) for k in order]
    export = result.get("export")
    if isinstance(export, dict) and export.get("path"):
        rows.append(("export", str(export["path"])))
    return rows


def event_time(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def event_line(event: dict[str, Any], now: datetime) -> str:
    count = int(event.get("count") or 1)
    times = f" (x{count})" if count > 1 else ""
    return (f"{ago(event_time(event), now):>12}  {event.get('type', ''):<7}  {event.get('reason', '')}: "
            f"{event.get('message', '')}{times}")  # fmt: skip


def last_events(events: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    ordered = sorted(events, key=lambda e: (event_time(e), e.get("metadata", {}).get("name", "")))
    return ordered[-limit:] if limit > 0 else []


def render(job: dict[str, Any], events: list[dict[str, Any]], now: datetime, *, event_limit: int = 5) -> str:
    meta, spec, status = job.get("metadata") or {}, _spec(job), _status(job)
    workers = spec.get("workers") or {}
    phase = status.get("phase") or "Pending"
    replicas = status.get("replicas") or workers.get("replicas", "?")
    title = (f"DistTrainJob {meta.get('name')} in {meta.get('namespace')}: mode {spec.get('mode', '?')}, "
             f"{replicas} x {workers.get('procsPerWorker', 1)} processes, {phase}")  # fmt: skip
    rows: list[tuple[str, str]] = []
    if status.get("message"):
        rows.append(("message", str(status["message"])))
    rows.append(("progress", progress_text(job)))
    if status.get("lastCheckpointStep"):
        rows.append(("checkpoint", f"step {status['lastCheckpointStep']}"))
    backoff = (spec.get("runPolicy") or {}).get("backoffLimit")
    rows.append(("restarts", f"{status.get('restarts', 0)}" + (f" of backoffLimit {backoff}" if backoff is not None
                                                                else "")
                 + f", disruptions {status.get('disruptions', 0)} (not counted against it)"))  # fmt: skip
    counts = status.get("workers") or {}
    if counts:
        rows.append(("pods", ", ".join(f"{counts.get(k, 0)} {k}" for k in ("active", "pending", "succeeded",
                                                                             "failed"))))  # fmt: skip
    if status.get("commFraction") is not None:
        rows.append(("comm", f"{float(status['commFraction']) * 100:.1f}% of rank 0's step time waiting on "
                             "communication"))  # fmt: skip
    if status.get("hint"):
        rows.append(("hint", str(status["hint"])))
    for cond in status.get("conditions") or []:
        if cond.get("type") in ATTENTION and cond.get("status") == "True":
            rows.append(("condition", f"{cond['type']} ({cond.get('reason', '')}): {cond.get('message', '')}"))
    started = status.get("startTime")
    if started:
        rows.append(("started", f"{started} ({ago(started, now)})"))
    if status.get("completionTime"):
        took = (parse_time(status["completionTime"]), parse_time(started))
        span = f", took {format_eta((took[0] - took[1]).total_seconds())}" if took[0] and took[1] else ""
        rows.append(("finished", f"{status['completionTime']} ({ago(status['completionTime'], now)}{span})"))
    width = max(KEY_WIDTH, *(len(k) for k, _ in rows))
    lines = [title, *(f"  {k.ljust(width)}  {v}".rstrip() for k, v in rows)]
    result = status.get("result") or {}
    if phase in TERMINAL and isinstance(result, dict) and result:
        figures = result_rows(result)
        inner = max(len(k) for k, _ in figures) if figures else 0
        lines += ["  result", *(f"    {k.ljust(inner)}  {v}" for k, v in figures)]
    shown = last_events(events, event_limit)
    if shown:
        lines.append(f"events (last {len(shown)} of {len(events)}):" if len(events) > len(shown) else "events:")
        lines += [f"  {event_line(e, now)}" for e in shown]
    elif event_limit > 0:
        lines.append("events: none")
    return "\n".join(lines)
