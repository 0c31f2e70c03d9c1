"""`disttrain status JOB [-w]`: where a job stands (job_view.py renders it), and with -w its
moves as they happen until it succeeds or fails.

-w prints the whole picture once, then one line each time the job moves (phase, progress,
restarts, disruptions, hint) and each new Event, and the whole picture again at the end. It
reads the job and its Events every --interval seconds: two GETs, cheap for the API server.
Exit code with -w: 0 when the job Succeeded, 1 when it Failed or was deleted.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from . import job_view
from .cluster_args import EXIT_FAILED, add_cluster_args, with_cluster

if TYPE_CHECKING:
    from .cluster import Cluster


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "status",
        help="a DistTrainJob's phase, progress, ETA, restarts, hint, result and last events",
        description="Print a DistTrainJob's phase, progress and ETA, restarts and disruptions, the scaling "
        "hint, conditions that need attention, the result once it finished, and its last Events. "
        "With -w, follow it until it Succeeds (exit 0) or Fails (exit 1).",
    )
    p.add_argument("job", metavar="JOB", help="the DistTrainJob's name")
    p.add_argument("-w", "--watch", action="store_true", help="follow the job until it Succeeds or Fails")
    p.add_argument("--events", type=int, default=5, metavar="N", help="how many of the last Events to show (default 5)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="with -w: seconds between reads (default 2)")  # fmt: skip
    add_cluster_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return with_cluster(args, "status", lambda cluster: show(cluster, args))


class EventReader:
    """The job's Events; none (and one note, not one per read) when the user may not list Events."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.warned = cluster, False

    def __call__(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        from .cluster import ClusterError  # noqa: PLC0415 - kubernetes, loaded by with_cluster already

        try:
            return self.cluster.events(job)
        except ClusterError as err:
            if not self.warned:
                print(f"disttrain status: no events: {err}", file=sys.stderr)
                self.warned = True
            return []


def show(cluster: Cluster, args: argparse.Namespace) -> int:
    job = cluster.job(args.job)
    read_events = EventReader(cluster)
    events = read_events(job)
    print(job_view.render(job, events, datetime.now(UTC), event_limit=args.events), flush=True)
    if not args.watch:
        return 0
    if (job.get("status") or {}).get("phase") in job_view.TERMINAL:
        return outcome(job)
    return watch(cluster, args, job, events, read_events)


def watch(cluster: Cluster, args: argparse.Namespace, job: dict[str, Any], events: list[dict[str, Any]],
          read_events: EventReader) -> int:  # fmt: skip
    seen = {_event_key(e) for e in events}
    last = _moves(job)
    uid = job["metadata"]["uid"]
    while (job.get("status") or {}).get("phase") not in job_view.TERMINAL:
        time.sleep(args.interval)
        found = cluster.find_job(args.job)
        if found is None or found["metadata"]["uid"] != uid:
            print(f"{_clock()}  DistTrainJob {args.job} was deleted", flush=True)
            return EXIT_FAILED
        job = found
        fresh = [e for e in job_view.last_events(read_events(job), 1000) if _event_key(e) not in seen]
        for e in fresh:
            seen.add(_event_key(e))
            print(f"{_clock()}  event {e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}", flush=True)
        moves = _moves(job)
        if moves != last:
            last = moves
            print(f"{_clock()}  {job_view.headline(job)}", flush=True)
    print()
    print(job_view.render(job, read_events(job), datetime.now(UTC), event_limit=args.events), flush=True)
    return outcome(job)


def outcome(job: dict[str, Any]) -> int:
    return 0 if (job.get("status") or {}).get("phase") == "Succeeded" else EXIT_FAILED


def _moves(job: dict[str, Any]) -> tuple[Any, ...]:
    """What makes -w print a line: the headline's figures (not lastUpdateTime alone)."""
    s = job.get("status") or {}
    p = s.get("progress") or {}
    return (s.get("phase"), s.get("step"), p.get("completed"), p.get("eta"), s.get("restarts"), s.get("disruptions"),
            s.get("hint"))  # fmt: skip


def _event_key(e: dict[str, Any]) -> tuple[str, int]:
    return (str((e.get("metadata") or {}).get("uid") or (e.get("metadata") or {}).get("name")), int(e.get("count") or 1))


def _clock() -> str:
    return datetime.now().strftime("%H:%M:%S")
