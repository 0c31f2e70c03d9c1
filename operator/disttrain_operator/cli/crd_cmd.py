from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("crd", help="(not implemented yet)", description="(not implemented yet)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("disttrain crd: not implemented yet")
