"""`disttrain operator`: run the kopf operator (in its pod, or on a workstation with a kubeconfig)."""

from __future__ import annotations

import argparse

from disttrain_operator import settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "operator",
        help="run the DistTrainJob operator (kopf)",
        description="Run the kopf operator that turns DistTrainJobs into pods and recovers them. "
        "Every flag also has an env var DISTTRAIN_OPERATOR_<NAME> (flags win).",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", dest="namespaces", metavar="NS",
                       help="watch this namespace (repeatable; default: the operator's own namespace) "
                       "[DISTTRAIN_OPERATOR_NAMESPACE, comma-separated]")
    scope.add_argument("--all-namespaces", "-A", action="store_true", default=None,
                       help="watch every namespace (needs the cluster-scoped RBAC) [DISTTRAIN_OPERATOR_ALL_NAMESPACES]")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="port of the operator's own /metrics, 0 = off (default 8080) [DISTTRAIN_OPERATOR_METRICS_PORT]")
    p.add_argument("--liveness", default=None, metavar="URL",
                   help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz [DISTTRAIN_OPERATOR_LIVENESS]")
    p.add_argument("--default-image", default=None,
                   help="trainer image for jobs without spec.image (default disttrain-trainer:dev) "
                   "[DISTTRAIN_OPERATOR_DEFAULT_IMAGE]")
    p.add_argument("--poll-interval", type=float, default=None, dest="poll_interval_s",
                   help="seconds between progress scrapes of a running job's rank 0 (default 3) "
                   "[DISTTRAIN_OPERATOR_POLL_INTERVAL]")
    p.add_argument("--progress-interval", type=float, default=None, dest="progress_interval_s", metavar="SECONDS",
                   help="the most often a running job's progress alone (status.progress, step, pod counts) is "
                   "written to its status (default 10; never more often than --poll-interval) "
                   "[DISTTRAIN_OPERATOR_PROGRESS_INTERVAL]")
    p.add_argument("--node-lost-after", type=float, default=None, dest="node_lost_after_s", metavar="SECONDS",
                   help="seconds a running pod may stay NotReady (its node lost) before its gang is replaced and "
                   "its pods force-deleted (default 300, Kubernetes' pod-eviction default) "
                   "[DISTTRAIN_OPERATOR_NODE_LOST_AFTER]")
    p.add_argument("--checkpoint-storage-class", default=None, metavar="NAME",
                   help="StorageClass of the checkpoint claim created for a job without spec.checkpoint.volume "
                   "(default: the cluster's default StorageClass) [DISTTRAIN_OPERATOR_CHECKPOINT_STORAGE_CLASS]")
    p.add_argument("--leader-elect", action="store_true", default=None,
                   help="run only while holding the Lease disttrain-operator (one active replica, the others "
                   "standing by) [DISTTRAIN_OPERATOR_LEADER_ELECT]")
    p.add_argument("--lease-namespace", default=None,
                   help="namespace of that Lease (default: the operator's own) [DISTTRAIN_OPERATOR_LEASE_NAMESPACE]")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = settings.from_env(
            namespaces=tuple(args.namespaces) if args.namespaces else None,
            all_namespaces=args.all_namespaces,
            metrics_port=args.metrics_port,
            liveness=args.liveness,
            default_image=args.default_image,
            poll_interval_s=args.poll_interval_s,
            progress_interval_s=args.progress_interval_s,
            node_lost_after_s=args.node_lost_after_s,
            checkpoint_storage_class=args.checkpoint_storage_class,
            leader_elect=args.leader_elect,
            lease_namespace=args.lease_namespace,
        )
    except ValueError as err:
        raise SystemExit(f"disttrain operator: {err}") from None
    # Importing the runtime registers the handlers with kopf.
    from disttrain_operator import runtime  # noqa: PLC0415 - kopf and the Kubernetes client

    return runtime.run(cfg, verbose=args.verbose)
