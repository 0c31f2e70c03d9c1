"""The environment a pod needs to reach spec.objectStore: the credentials as references into the
user's Secret (secretKeyRef: the operator never reads it), the endpoint and region as values."""

from __future__ import annotations

from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import JobSpec


def object_store_env(spec: JobSpec) -> list[dict[str, Any]]:
    """Env entries for every pod of a job with spec.objectStore (none without one)."""
    store = spec.object_store
    if store is None:
        return []
    env: list[dict[str, Any]] = []
    if store.credentials_secret:
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": store.credentials_secret, "key": key}}}
                for key in c.OBJECT_STORE_SECRET_KEYS]  # fmt: skip
    if store.endpoint:
        env.append({"name": c.ENV_AWS_ENDPOINT_URL, "value": store.endpoint})
    if store.region:
        env += [{"name": c.ENV_AWS_REGION, "value": store.region},
                {"name": c.ENV_AWS_DEFAULT_REGION, "value": store.region}]  # fmt: skip
    return env
