"""mode: paramserver — asynchronous Downpour SGD: a parameter-server Deployment +
gRPC Service per shard (paramServer.shards) holding the parameters, and worker pods
that pull/push to them."""

from __future__ import annotations

from disttrain_api import constants as c
from disttrain_api.model import JobSpec, ParamServerSpec

from .common import BuildContext, Children
from .served import build_served


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    ps = spec.param_server or ParamServerSpec()
    return build_served(
        spec, ctx, server_role=c.ROLE_SERVER, client_role=c.ROLE_WORKER, port_name="grpc", port=ps.port,
        servers=ps.shards,
    )
