"""`disttrain delete JOB [--wait]`: delete a DistTrainJob; the garbage collector deletes what it
owns (pods, Services, ConfigMaps, Deployments, Secrets) through their owner references.

--wait deletes in the foreground (the job stays, being deleted, until the children that block
it are gone) and returns once the job and every pod carrying its name are gone, so the next
job of the same name never meets a pod of this one.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from disttrain_api import constants as c

from .cluster_args import EXIT_FAILED, add_cluster_args, with_cluster

if TYPE_CHECKING:
    from .cluster import Cluster

POLL_S = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "delete",
        help="delete a DistTrainJob and (through owner references) everything it made",
        description="Delete a DistTrainJob; the garbage collector deletes its pods, Services, ConfigMaps, "
        "Deployments and Secrets. With --wait, return once the job and all its pods are gone (exit 1 after "
        "--timeout).",
    )
    p.add_argument("job", metavar="JOB", help="the DistTrainJob's name")
    p.add_argument("--wait", action="store_true", help="wait until the job and its pods are gone")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="with --wait: give up after this long (default 300)")  # fmt: skip
    p.add_argument("--ignore-not-found", action="store_true", help="a job that does not exist is not an error")
    add_cluster_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return with_cluster(args, "delete", lambda cluster: delete(cluster, args))


def delete(cluster: Cluster, args: argparse.Namespace) -> int:
    from .cluster import NotFound  # noqa: PLC0415 - kubernetes, loaded by with_cluster already

    try:
        cluster.delete_job(args.job, propagation="Foreground" if args.wait else "Background")
    except NotFound:
        if args.ignore_not_found:
            return 0
        cluster.job(args.job)  # raises NotFound naming the namespace's jobs
        raise
    print(f"DistTrainJob {args.job} deleted in namespace {cluster.namespace}", flush=True)
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    selector = f"{c.LABEL_JOB}={args.job}"
    while True:
        job = cluster.find_job(args.job)
        pods = [p["metadata"]["name"] for p in cluster.pods(selector)]
        if job is None and not pods:
            print(f"DistTrainJob {args.job} and its pods are gone", flush=True)
            return 0
        if time.monotonic() > deadline:
            left = (["the job (its children still being deleted)"] if job is not None else []) + \
                [f"pod {p}" for p in sorted(pods)]
            print(f"disttrain delete: still there after {args.timeout:.0f} s: {', '.join(left)}", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(POLL_S)
