"""kopf handlers: thin. Each one just triggers `reconcile.reconcile` for its job.

Importing this module registers the handlers with kopf's default registry; call
`configure(settings)` first (the CLI does) so they know the operator settings.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

import kopf
from disttrain_api.model import GROUP, PLURAL, VERSION

from . import reconcile as rec
from .decide import needs_polling
from .kube import Kube
from .settings import OperatorSettings

_state: dict[str, Any] = {"settings": OperatorSettings(), "kube": None}
# Read at import (decorator argument); the CLI exports it before importing this module.
POLL_INTERVAL_S = float(os.environ.get("DISTTRAIN_OPERATOR_POLL_INTERVAL") or 3.0)


def configure(settings: OperatorSettings) -> None:
    _state["settings"] = settings


def _kube() -> Kube:
    if _state["kube"] is None:
        _state["kube"] = Kube()
    return _state["kube"]


def _post(job: dict[str, Any], type_: str, reason: str, message: str) -> None:
    # kopf posts Events asynchronously (and retries); they are attached to the job.
    kopf.event(job, type=type_, reason=reason, message=message[:1000])


def _run(namespace: str, name: str, *, wait: bool = True) -> None:
    rec.reconcile(_kube(), _state["settings"], namespace, name, _post, wait=wait)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's bookkeeping lives in annotations under our group; status belongs to the API.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Only warnings from kopf itself become Events; ours are posted explicitly per transition.
    settings.posting.level = logging.WARNING
    # Sync handlers run in this thread pool; each reconcile is a few blocking API calls.
    settings.execution.max_workers = 16
    # One operator replica (the Deployment has replicas: 1): no peering objects needed.
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    _kube()


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def changed(namespace: str, name: str, **_: Any) -> None:
    _run(namespace, name)


@kopf.timer(GROUP, VERSION, PLURAL, interval=POLL_INTERVAL_S, initial_delay=1.0)
def poll(namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
    """Progress (rank 0's metrics) and recovery (failed / vanished / unschedulable pods)."""
    if needs_polling(dict(body), datetime.now(UTC), POLL_INTERVAL_S):
        _run(namespace, name, wait=False)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def deleted(namespace: str, name: str, uid: str, **_: Any) -> None:
    # Children carry owner references: the garbage collector deletes them.
    rec.forget(namespace, name, uid)


@kopf.on.probe(id="jobs")
def jobs_probe(**_: Any) -> int:
    return len(rec._locks)
