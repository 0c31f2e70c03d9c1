"""`disttrain logs JOB [--rank N | --role ROLE [--index I]] [-f]`: a job's trainer log, from the
pod that runs the rank (or role) asked for, found by the job's labels (pod_choice.py).

With -f it follows the job, not one pod: when a gang restart replaces the pod, the next
attempt's pod is followed from its start (a line on standard error marks the switch), until the
job Succeeds, Fails or is deleted.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from disttrain_api import constants as c

from .cluster_args import EXIT_INVALID, add_cluster_args, with_cluster

if TYPE_CHECKING:
    from .cluster import Cluster

POLL_S = 1.0  # while waiting for a pod to start, or for the job to end after one did
# A followed log ends when its container does, a moment before the pod's status says so; only a
# container still running this long after is taken for a stream that broke off (and resumed).
RESUME_AFTER_S = 5.0
ROLES = (c.ROLE_WORKER, c.ROLE_CLIENT, c.ROLE_AGGREGATOR, c.ROLE_SERVER)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "logs",
        help="a DistTrainJob's trainer log (rank 0's unless --rank or --role), -f to follow it across restarts",
        description="Print the trainer log of one of the job's pods: rank 0's by default (a federated job: "
        "its aggregator's), --rank N's, or --role ROLE's (--index I among several: clients, workers, "
        "parameter-server shards). The pod is the current attempt's: after a gang restart, the new one. "
        "With -f, follow the log until the job ends, switching to the replacement pod after a restart.",
    )
    p.add_argument("job", metavar="JOB", help="the DistTrainJob's name")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, metavar="N", help="the pod that runs global rank N")
    which.add_argument("--role", choices=ROLES,
                       help="a pod of this role: worker (collective modes, parameter-server workers), client or "
                       "aggregator (federated), server (parameter server)")  # fmt: skip
    p.add_argument("--index", type=int, metavar="I", help="with --role: which pod of that role (default 0)")
    p.add_argument("-f", "--follow", action="store_true", help="follow the log until the job ends")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines (of the first pod followed)")
    add_cluster_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.index is not None and args.role is None:
        print("disttrain logs: --index needs --role", file=sys.stderr)
        return EXIT_INVALID
    return with_cluster(args, "logs", lambda cluster: logs(cluster, args))


def logs(cluster: Cluster, args: argparse.Namespace) -> int:
    from disttrain_operator.topology.common import CONTAINER  # noqa: PLC0415 - cryptography (the topology package)

    from . import job_view, pod_choice  # noqa: PLC0415 - cryptography (the operator's topology)
    from .cluster import ClusterError  # noqa: PLC0415 - kubernetes, loaded by with_cluster already

    job = cluster.job(args.job)
    uid = job["metadata"]["uid"]
    try:
        target = pod_choice.target_for(job, rank=args.rank, role=args.role, index=args.index)
    except ValueError as err:
        raise ClusterError(f"{args.job}: {err}", exit_code=EXIT_INVALID) from None
    out = sys.stdout.buffer
    streamed: str | None = None  # the UID of the pod whose log was copied last
    ended_at = 0.0
    waiting_said = False
    while True:
        pod = pod_choice.pick(cluster.pods(target.selector(args.job)), uid)
        meta: dict[str, Any] = (pod or {}).get("metadata") or {}
        ready = pod is not None and pod_choice.has_log(pod, CONTAINER)
        broke_off = meta.get("uid") == streamed and _still_running(pod, CONTAINER) and \
            time.monotonic() - ended_at > RESUME_AFTER_S
        if pod is not None and ready and (meta["uid"] != streamed or broke_off):
            resumed = meta["uid"] == streamed
            if streamed is not None and not resumed:
                attempt = meta.get("labels", {}).get(c.LABEL_RESTART_ATTEMPT, "?")
                print(f"--- {target.what}: pod {meta['name']}, attempt {attempt} ---", file=sys.stderr, flush=True)
            since = int(time.monotonic() - ended_at) + 1 if resumed else None
            try:
                cluster.copy_log(meta["name"], CONTAINER, out, follow=args.follow,
                                 tail=args.tail if streamed is None else None, since_seconds=since)  # fmt: skip
            except ClusterError as err:
                # Following, a pod that went (404) or is not quite started (400) between the look and
                # the read is looked for again; anything else (a 403, an unreachable cluster) ends it.
                if not args.follow or err.status not in (400, 404):
                    raise
                time.sleep(POLL_S)
                continue
            if not args.follow:
                return 0
            streamed, ended_at = meta["uid"], time.monotonic()
            continue
        if not args.follow:
            if pod is None:
                phase = (job.get("status") or {}).get("phase") or "Pending"
                if phase in job_view.TERMINAL:
                    raise ClusterError(f"{args.job} {phase}; no pod for {target.what} is left (runPolicy."
                                       "cleanPodPolicy deletes them)")  # fmt: skip
                raise ClusterError(f"{args.job} ({phase}) has no pod for {target.what} yet; -f waits for it")
            state, reason = pod_choice.container_state(pod, CONTAINER)
            raise ClusterError(f"pod {meta['name']} ({target.what}) has not started ({reason or state}); "
                               "-f waits for it")  # fmt: skip
        now = cluster.find_job(args.job)
        if now is None or now["metadata"]["uid"] != uid or now["metadata"].get("deletionTimestamp"):
            print(f"--- DistTrainJob {args.job} was deleted ---", file=sys.stderr, flush=True)
            return 0
        if (now.get("status") or {}).get("phase") in job_view.TERMINAL and (pod is None or not ready
                                                                             or meta["uid"] == streamed):
            return 0
        if not waiting_said and not ready:
            print(f"--- waiting for {target.what}'s pod to start ---", file=sys.stderr, flush=True)
            waiting_said = True
        time.sleep(POLL_S)


def _still_running(pod: dict[str, Any] | None, container: str) -> bool:
    from . import pod_choice  # noqa: PLC0415 - cryptography (the operator's topology)

    return pod is not None and pod_choice.container_state(pod, container)[0] == "running" and not pod["metadata"].get("deletionTimestamp")
