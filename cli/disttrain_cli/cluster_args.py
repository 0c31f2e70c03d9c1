"""The flags every command that talks to a cluster shares, with kubectl's meaning, and the one
place their errors become messages and exit codes.

Which cluster and namespace (as kubectl decides): `--kubeconfig FILE`, else the files listed in
`KUBECONFIG` (merged, first wins), else ~/.kube/config, else the pod's own service account when
running inside a cluster; `--context NAME`, else the kubeconfig's current context; `-n NS`, else
that context's namespace, else `default`.

Light on purpose: the Kubernetes client is imported only when a command runs (cluster.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from disttrain_api import exitcodes

if TYPE_CHECKING:
    from .cluster import Cluster

# Exit codes of the cluster commands: 0 done; 1 the cluster said no or could not be reached, or
# the job failed (status -w); 2 bad input (an invalid manifest, a usage error: argparse's own).
EXIT_FAILED = exitcodes.FAILED
EXIT_INVALID = exitcodes.CONFIG


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", metavar="NS",
                   help="the job's namespace (default: the kubeconfig context's namespace, else default)")
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
                   "service account)")  # fmt: skip
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current context)")


def follow_hint(args: argparse.Namespace, namespace: str) -> str:
    """The cluster flags to repeat in a command printed for the user to run next."""
    flags = [f"-n {namespace}"]
    if args.context:
        flags.append(f"--context {args.context}")
    if args.kubeconfig:
        flags.append(f"--kubeconfig {args.kubeconfig}")
    return " ".join(flags)


def with_cluster(args: argparse.Namespace, command: str, body: Callable[[Cluster], int]) -> int:
    """Connect as the flags say and run `body`; a ClusterError is printed as
    `disttrain COMMAND: message` and exits 1."""
    try:
        from . import cluster  # noqa: PLC0415 - kubernetes: only the cluster commands load the client
    except ImportError as err:  # installed without the operator extra
        print(f"disttrain {command}: needs the Kubernetes client ({err}): pip install 'disttrain[operator]'",
              file=sys.stderr)  # fmt: skip
        return EXIT_FAILED

    try:
        conn = cluster.connect(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)
        return body(conn)
    except cluster.ClusterError as err:
        print(f"disttrain {command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED
