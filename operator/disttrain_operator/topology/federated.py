"""mode: federated — FedAvg/FedProx: an aggregator Deployment + gRPC Service, and
client pods that each simulate clients/replicas logical clients and report rounds."""

from __future__ import annotations

from disttrain_api import constants as c
from disttrain_api.model import FederatedSpec, JobSpec

from .common import BuildContext, Children
from .served import build_served


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    fed = spec.federated or FederatedSpec()
    return build_served(
        spec, ctx, server_role=c.ROLE_AGGREGATOR, client_role=c.ROLE_CLIENT, port_name="grpc", port=fed.port
    )
