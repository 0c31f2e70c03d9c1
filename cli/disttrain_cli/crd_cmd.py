"""`disttrain crd`: print the DistTrainJob CRD, generated from the typed model.

`disttrain crd | kubectl apply -f -` installs it; `make manifests` writes it to
manifests/crd/disttrainjobs.yaml.
"""

from __future__ import annotations

import argparse
import sys

from disttrain_api.crd import crd_yaml


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "crd",
        help="print the DistTrainJob CustomResourceDefinition as YAML",
        description="Print the DistTrainJob CustomResourceDefinition (apiextensions.k8s.io/v1), generated "
        "from the API model. Install it with: disttrain crd | kubectl apply -f -",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(crd_yaml())
    return 0
