"""mode: federated — an aggregator Deployment + gRPC Service, and client pods that each
host clients/replicas simulated clients (FedAvg/FedProx/FedAdam, see the trainer's federated/).

The channel is secured by two Secrets (federated_secrets.py): the aggregator mounts the
TLS key pair, clients only the CA to verify it; both mount the token key.
"""

from __future__ import annotations

from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import FederatedSpec, JobSpec

from .common import CONTAINER, BuildContext, Children
from .federated_secrets import (
    CA_FILE,
    build_tls_secret,
    build_token_secret,
    tls_secret_name,
    token_secret_name,
)
from .served import build_served, server_name

TLS_VOLUME = "federated-tls"
TOKEN_VOLUME = "federated-token"


def _secure(pod_spec: dict[str, Any], ctx: BuildContext, fed: FederatedSpec, *, server: bool) -> None:
    tls: dict[str, Any] = {"secretName": tls_secret_name(ctx.name, fed, ctx.uid), "defaultMode": 0o440}
    if not server:
        tls["items"] = [{"key": CA_FILE, "path": CA_FILE}]  # clients never see the server's key
    volumes = [{"name": TOKEN_VOLUME, "secret": {"secretName": token_secret_name(ctx.name, fed, ctx.uid),
                                             "defaultMode": 0o440}}]
    mounts = [{"name": TOKEN_VOLUME, "mountPath": c.FED_TOKEN_MOUNT_DIR, "readOnly": True}]
    env = {c.ENV_FED_TOKEN_KEY_FILE: f"{c.FED_TOKEN_MOUNT_DIR}/{c.FED_TOKEN_SECRET_KEY}"}
    if fed.tls:
        volumes.append({"name": TLS_VOLUME, "secret": tls})
        mounts.append({"name": TLS_VOLUME, "mountPath": c.FED_TLS_MOUNT_DIR, "readOnly": True})
        env[c.ENV_FED_TLS_DIR] = c.FED_TLS_MOUNT_DIR
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), *volumes]
    for container in pod_spec["containers"]:
        if container["name"] == CONTAINER:
            container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
            have = {e["name"] for e in container.get("env", [])}  # never override what the user set
            container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in env.items() if k not in have)]


def build(spec: JobSpec, ctx: BuildContext) -> Children:
    fed = spec.federated or FederatedSpec()
    children = build_served(
        spec, ctx, server_role=c.ROLE_AGGREGATOR, client_role=c.ROLE_CLIENT, port_name="grpc", port=fed.port
    )
    for deployment in children.deployments:
        _secure(deployment["spec"]["template"]["spec"], ctx, fed, server=True)
    for pod in children.pods:
        _secure(pod["spec"], ctx, fed, server=False)
    # The Secrets the user did not name; the reconciler creates them once (never replaced).
    if fed.tls and not fed.tls_secret_name:
        children.secrets.append(build_tls_secret(ctx, fed, server_name(ctx.name, c.ROLE_AGGREGATOR)))
    if not fed.token_secret_name:
        children.secrets.append(build_token_secret(ctx, fed))
    return children
