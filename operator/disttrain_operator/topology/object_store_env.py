"""The environment a pod needs to reach spec.objectStore: the credentials as references into the
user's Secret (secretKeyRef: the operator never reads it), the endpoint and region as values.

Which Secret: the pods that write checkpoints (disttrain_api.checkpoint_access) get
credentialsSecret; with checkpoint.uri the others (federated clients, parameter-server workers
but worker 0) get dataCredentialsSecret or nothing, never the checkpoints' credentials."""

from __future__ import annotations

from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import JobSpec


def credentials_secret(spec: JobSpec, *, writes_checkpoints: bool) -> str | None:
    store = spec.object_store
    if store is None:
        return None
    if writes_checkpoints:
        return store.credentials_secret
    if spec.checkpoint.uri:  # the checkpoint credentials are for writers only
        return store.data_credentials_secret
    return store.data_credentials_secret or store.credentials_secret


def object_store_env(spec: JobSpec, *, writes_checkpoints: bool = True) -> list[dict[str, Any]]:
    """Env entries for one pod of a job with spec.objectStore (none without one)."""
    store = spec.object_store
    if store is None:
        return []
    env: list[dict[str, Any]] = []
    secret = credentials_secret(spec, writes_checkpoints=writes_checkpoints)
    if secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
                for key in c.OBJECT_STORE_SECRET_KEYS]  # fmt: skip
    if store.endpoint:
        env.append({"name": c.ENV_AWS_ENDPOINT_URL, "value": store.endpoint})
    if store.region:
        env += [{"name": c.ENV_AWS_REGION, "value": store.region},
                {"name": c.ENV_AWS_DEFAULT_REGION, "value": store.region}]  # fmt: skip
    return env
