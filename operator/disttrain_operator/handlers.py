"""kopf handlers: thin. Each one just triggers `reconcile.reconcile` for its job.

Importing this module registers the handlers with kopf's default registry; call
`configure(settings)` first (the CLI does) so they know the operator settings.

No handler makes kopf put a finalizer on jobs (no timers, daemons or mandatory delete
handlers): deleting a job never waits for the operator, and the garbage collector
removes its children through their owner references. See poller.py.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from disttrain_api.model import GROUP, PLURAL, VERSION

from . import reconcile as rec
from .kube import Kube
from .poller import JobRegistry, Poller
from .settings import OperatorSettings

log = logging.getLogger("disttrain.operator")
_state: dict[str, Any] = {"settings": OperatorSettings(), "kube": None}
JOBS = JobRegistry()


def configure(settings: OperatorSettings) -> None:
    _state["settings"] = settings
    _state["poller"] = Poller(JOBS, _poll, settings.poll_interval_s)


def _kube() -> Kube:
    if _state["kube"] is None:
        _state["kube"] = Kube()
    return _state["kube"]


def _post(job: dict[str, Any], type_: str, reason: str, message: str) -> None:
    # Posted directly, not with kopf.event: that needs kopf's per-object context, which the
    # periodic reconcile does not run in. Events are auxiliary: a failed post is logged.
    try:
        _kube().post_event(job, type_, reason, message)
    except Exception as err:  # noqa: BLE001
        log.warning("%s/%s: could not post Event %s: %s", job["metadata"]["namespace"], job["metadata"]["name"],
                    reason, err)


def _run(namespace: str, name: str, *, wait: bool = True) -> None:
    rec.reconcile(_kube(), _state["settings"], namespace, name, _post, wait=wait)


def _poll(namespace: str, name: str) -> None:
    # wait=False: skip a job whose reconcile is still running instead of parking a thread.
    _run(namespace, name, wait=False)


def _poller() -> Poller:
    if "poller" not in _state:
        configure(_state["settings"])
    poller: Poller = _state["poller"]
    return poller


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's bookkeeping lives in annotations under our group; status belongs to the API.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Jobs created by an operator version that used a timer still carry this finalizer;
    # kopf removes it from them because no handler needs it any more.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Only warnings from kopf itself become Events; ours are posted explicitly per transition.
    settings.posting.level = logging.WARNING
    # Sync handlers and the periodic reconciles run in this thread pool; each reconcile is
    # a few blocking API calls.
    settings.execution.max_workers = 16
    # One operator replica (the Deployment has replicas: 1): no peering objects needed.
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    _kube()
    _poller().start(settings.execution.executor)


@kopf.on.event(GROUP, VERSION, PLURAL)
def seen(event: dict[str, Any], namespace: str, name: str, uid: str, body: kopf.Body, **_: Any) -> None:
    """Every watch event (and the initial listing): keep the registry of jobs current."""
    if event.get("type") == "DELETED":
        JOBS.gone(namespace, name)
        rec.forget(namespace, name, uid)
    else:
        JOBS.seen(namespace, name, dict(body))


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def changed(namespace: str, name: str, **_: Any) -> None:
    _run(namespace, name)


@kopf.on.probe(id="jobs")
def jobs_probe(**_: Any) -> int:
    return len(JOBS)


# PERMANENT: a failing probe answers the liveness request with an error at once (kopf
# would otherwise retry it with back-off while the request waits).
@kopf.on.probe(id="pollerAgeSeconds", errors=kopf.ErrorsMode.PERMANENT)
def poller_probe(**_: Any) -> float:
    return _poller().check()
