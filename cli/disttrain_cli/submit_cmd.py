"""`disttrain submit FILE`: validate the manifest exactly as `disttrain validate` does, then
create or update its DistTrainJob(s) through the Kubernetes API, and say how to follow them.

A job that exists already is updated as `kubectl replace` would: its spec becomes the file's
(fields left out take their defaults again), its labels and annotations gain the file's. The
operator applies what may change while a job runs (e.g. workers.replicas within spec.elastic)
and refuses the rest with an InvalidSpec condition, as for any edit.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from . import validate_cmd
from .cluster_args import EXIT_INVALID, add_cluster_args, follow_hint, with_cluster

if TYPE_CHECKING:
    from .cluster import Cluster

CONFLICT_RETRIES = 3  # someone else (the operator's status writes do not count) changed the job meanwhile


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "submit",
        help="validate a DistTrainJob manifest, then create or update the job on the cluster",
        description="Check FILE exactly as `disttrain validate` does (nothing is sent when a problem is "
        "found: exit 2), then create each DistTrainJob in it, or update one that exists (its spec becomes "
        "the file's), and print how to follow it. The namespace: the manifest's, else -n, else the "
        "kubeconfig context's. Exit 1 when the cluster cannot be reached or refuses.",
    )
    p.add_argument("file", metavar="FILE", help="manifest file; - reads standard input")
    add_cluster_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    name = "<stdin>" if args.file == "-" else args.file
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"disttrain submit: {name}: cannot read: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return EXIT_INVALID
    out: list[str] = []
    problems: list[str] = []
    validate_cmd.validate_text(text, name, out, problems)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"disttrain submit: {name} is not valid; nothing was submitted", file=sys.stderr)
        return EXIT_INVALID
    docs = validate_cmd.job_documents(text)

    def submit(cluster: Cluster) -> int:
        for doc in docs:
            ns, verb = apply_job(cluster, doc, namespace_flag=args.namespace)
            job = doc["metadata"]["name"]
            flags = follow_hint(args, ns)
            print(f"DistTrainJob {job} {verb} in namespace {ns}")
            print(f"  follow it:  disttrain status {job} {flags} -w")
            print(f"  its logs:   disttrain logs {job} {flags} -f")
        return 0

    return with_cluster(args, "submit", submit)


def apply_job(cluster: Cluster, doc: dict[str, Any], *, namespace_flag: str | None) -> tuple[str, str]:
    """Create or update the job; (its namespace, "created" | "configured" | "unchanged")."""
    from .cluster import ClusterError, Conflict  # noqa: PLC0415 - kubernetes, loaded by with_cluster already

    meta = dict(doc.get("metadata") or {})
    ns = meta.get("namespace") or namespace_flag or cluster.namespace
    if namespace_flag and ns != namespace_flag:
        raise ClusterError(f"{meta.get('name')}: the manifest's namespace {ns} is not -n {namespace_flag}",
                           exit_code=EXIT_INVALID)  # fmt: skip
    cluster = dataclasses.replace(cluster, namespace=ns)
    for attempt in range(CONFLICT_RETRIES):
        live = cluster.find_job(meta["name"])
        if live is None:
            cluster.create_job({**doc, "metadata": {**meta, "namespace": ns}})
            return ns, "created"
        live_meta = live["metadata"]
        merged = {**live_meta}
        for key in ("labels", "annotations"):
            if meta.get(key):
                merged[key] = {**(live_meta.get(key) or {}), **meta[key]}
        body = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": merged, "spec": doc.get("spec") or {}}
        try:
            updated = cluster.replace_job(meta["name"], body)
        except Conflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise
            continue
        changed = updated["metadata"].get("generation") != live_meta.get("generation") or any(
            updated["metadata"].get(k) != live_meta.get(k) for k in ("labels", "annotations"))
        return ns, "configured" if changed else "unchanged"
    raise AssertionError("unreachable")  # pragma: no cover
