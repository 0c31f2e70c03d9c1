"""mode: federated — an aggregator Deployment + gRPC Service, and client pods that each
host clients/replicas simulated clients (FedAvg/FedProx/FedAdam, see the trainer's federated/).

The channel is secured by the Secrets of credentials.py: the aggregator mounts the TLS
key pair and the server key, each client pod only the CA and its own clients' credentials.
"""

from __future__ import annotations

from disttrain_api import constants as c
from disttrain_api.identities import client_ids, pod_clients
from disttrain_api.model import FederatedSpec, JobSpec

from .common import BuildContext, Children
from .served import build_served, secure_served


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    fed = spec.federated or FederatedSpec()
    children = build_served(
        spec, ctx, server_role=c.ROLE_AGGREGATOR, client_role=c.ROLE_CLIENT, port_name="grpc", port=fed.port
    )
    nproc, world = spec.workers.procs_per_worker, ctx.replicas * spec.workers.procs_per_worker
    secure_served(
        children, ctx, tls=fed.tls, tls_secret_name=fed.tls_secret_name, identities=client_ids(fed.clients),
        pod_identities=lambda index: pod_clients(fed.clients, index, nproc, world),
    )  # fmt: skip
    return children
