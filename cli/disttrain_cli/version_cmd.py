"""`disttrain version`: the package version and the API version it serves."""

from __future__ import annotations

import argparse

from disttrain_api.model import API_VERSION
from disttrain_operator import __version__


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "version", help="print the disttrain version", description="Print the disttrain version and API version."
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(f"disttrain {__version__} (API {API_VERSION})")
    return 0
