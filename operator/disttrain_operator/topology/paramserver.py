"""mode: paramserver — asynchronous Downpour SGD: a parameter-server Deployment +
gRPC Service per shard (paramServer.shards) holding the parameters, and worker pods
that pull/push to them.

Secured like the federated channel (credentials.py): every shard mounts the TLS key
pair (one certificate for all shard Services) and the server key, each worker pod the
CA and its own worker id's credential. Credentials are minted for every worker the
gang may ever have (up to elastic.maxReplicas)."""

from __future__ import annotations

from disttrain_api import constants as c
from disttrain_api.identities import worker_id, worker_ids
from disttrain_api.model import JobSpec, ParamServerSpec

from .common import BuildContext, Children
from .served import build_served, secure_served


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    ps = spec.param_server or ParamServerSpec()
    children = build_served(
        spec, ctx, server_role=c.ROLE_SERVER, client_role=c.ROLE_WORKER, port_name="grpc", port=ps.port,
        servers=ps.shards,
    )
    most = max(ctx.replicas, spec.workers.replicas, spec.elastic.max_replicas if spec.elastic else 0)
    # procsPerWorker is 1 in this mode (validation): pod i is worker i.
    secure_served(children, ctx, tls=ps.tls, tls_secret_name=ps.tls_secret_name, identities=worker_ids(most),
                  pod_identities=lambda index: [worker_id(index)])  # fmt: skip
    return children
