"""The `disttrain` command line: validate, submit, status, logs, delete, local, explain, crd,
operator, version.

Each subcommand lives in its own module `<name>_cmd.py` exposing `register(subparsers)` (a new
command is one module and one entry in SUBCOMMANDS). The CLI depends on the API, the operator and
the trainer's launcher; nothing depends on it. Heavy imports (kopf, the Kubernetes client, the
trainer package) happen inside the command's handler, so `disttrain validate` stays fast and
works without the trainer or operator extras.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = ("validate", "submit", "status", "logs", "delete", "local", "explain", "crd", "operator", "version")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disttrain",
        description="Distributed neural-network training on Kubernetes: validate a job's manifest, submit "
        "it to a cluster and follow it (status, logs, delete), run it on this machine, forecast its "
        "scaling, print the CRD, run the operator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"disttrain_cli.{name}_cmd")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code = args.handler(args)
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
