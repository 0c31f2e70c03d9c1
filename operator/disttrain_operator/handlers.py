"""kopf handlers: thin. Watch events of jobs and of their pods update the operator's caches
and queue the job for a reconcile (workqueue.py -> reconcile.py); nothing polls the API.

- jobs: every watch event stores the job in `JOBS` (the reconcile reads it from there);
- pods carrying the job label: kopf's index `pods_by_job` keeps them by (namespace, job
  name), and every pod event queues its job. kopf calls no other handler before every
  index is filled by its initial listing, so the first reconcile after a (re)start already
  sees every existing pod and never re-creates a running gang.

Importing this module registers the handlers with kopf's default registry; call
`configure(settings)` first (the CLI does) so they know the operator settings.

No handler makes kopf put a finalizer on jobs (only event handlers: no timers, daemons or
change handlers): deleting a job never waits for the operator, and the garbage collector
removes its children through their owner references. Nor does kopf write its bookkeeping
annotations on jobs, so the operator's status patch is the only writer besides the user.
"""

from __future__ import annotations

import copy
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from disttrain_api import constants as c
from disttrain_api.model import GROUP, PLURAL, VERSION

from . import progress
from .cache import JobCache, JobKey
from .kube import Kube
from .observe import slim_pod
from .reconcile import Reconciler
from .scraper import ProgressScraper
from .settings import OperatorSettings
from .workqueue import WorkQueue

log = logging.getLogger("disttrain.operator")
# Reconciles at once (each blocks on API calls); a pool of their own, so that kopf's own
# sync work never waits behind them.
RECONCILE_THREADS = 16
JOBS = JobCache()
_state: dict[str, Any] = {"settings": OperatorSettings(), "kube": None, "index": None}


def configure(settings: OperatorSettings) -> None:
    _state["settings"] = settings
    _state.pop("queue", None)


def _kube() -> Kube:
    if _state["kube"] is None:
        _state["kube"] = Kube()
    return _state["kube"]


# Events are posted off the reconcile thread: a reconcile never waits for one.
_EVENTS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="events")


def _post(job: dict[str, Any], type_: str, reason: str, message: str) -> None:
    _EVENTS.submit(_post_now, job, type_, reason, message)


def _post_now(job: dict[str, Any], type_: str, reason: str, message: str) -> None:
    # Posted directly, not with kopf.event: that needs kopf's per-object context, which a
    # queued reconcile does not run in. Events are auxiliary: a failed post is logged.
    try:
        _kube().post_event(job, type_, reason, message)
    except Exception as err:  # noqa: BLE001
        log.warning("%s/%s: could not post Event %s: %s", job["metadata"]["namespace"], job["metadata"]["name"],
                    reason, err)


def _pods(key: JobKey) -> list[dict[str, Any]]:
    """The job's pods as kopf's index has them, copied in the event loop's thread (the only
    one that changes the index) for the reconcile thread."""
    index = _state["index"]
    return list(index[key]) if index is not None and key in index else []


def _queue() -> WorkQueue:
    if "queue" not in _state:
        settings: OperatorSettings = _state["settings"]
        scraper = ProgressScraper(lambda ip, port: progress.scrape(ip, port, settings.scrape_timeout_s),
                                  lambda key: _queue().add(key), interval_s=settings.poll_interval_s)
        reconciler = Reconciler(_kube(), settings, JOBS, scraper, _post)
        _state.update(scraper=scraper, reconciler=reconciler,
                      queue=WorkQueue(reconciler, prepare=_pods, workers=RECONCILE_THREADS))
    queue: WorkQueue = _state["queue"]
    return queue


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's bookkeeping lives in annotations under our group; status belongs to the API.
    # (Only change handlers write them; there are none, see the module docstring.)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Jobs created by an operator version that used a timer still carry this finalizer;
    # kopf removes it from them because no handler needs it any more.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Only warnings from kopf itself become Events; ours are posted explicitly per transition.
    settings.posting.level = logging.WARNING
    # One operator replica (the Deployment has replicas: 1): no peering objects needed.
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    _kube()
    _queue().start(ThreadPoolExecutor(max_workers=RECONCILE_THREADS, thread_name_prefix="reconcile"))
    _state["scraper"].start()


# async: runs in the event loop for every pod event, not in a thread.
@kopf.index("", "v1", "pods", labels={c.LABEL_JOB: kopf.PRESENT})
async def pods_by_job(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[JobKey, dict[str, Any]]:
    return {(namespace, labels[c.LABEL_JOB]): slim_pod(dict(body))}


@kopf.on.event("", "v1", "pods", labels={c.LABEL_JOB: kopf.PRESENT})
async def pod_seen(namespace: str, labels: kopf.Labels, pods_by_job: kopf.Index[JobKey, Any], **_: Any) -> None:
    _state["index"] = pods_by_job
    _queue().add((namespace, labels[c.LABEL_JOB]))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_seen(event: dict[str, Any], namespace: str, name: str, uid: str, body: kopf.Body,
                   pods_by_job: kopf.Index[JobKey, Any], **_: Any) -> None:
    _state["index"] = pods_by_job
    key = (namespace, name)
    if event.get("type") == "DELETED":
        JOBS.drop(key, uid)
        _queue().forget(key)
        _state["reconciler"].forget(key, uid)
    elif JOBS.put(key, copy.deepcopy(dict(body))):  # not our own status write coming back
        _queue().add(key)


@kopf.on.probe(id="jobs")
def jobs_probe(**_: Any) -> int:
    return len(JOBS)


# PERMANENT: a failing probe answers the liveness request with an error at once (kopf
# would otherwise retry it with back-off while the request waits).
@kopf.on.probe(id="queueAgeSeconds", errors=kopf.ErrorsMode.PERMANENT)
def queue_probe(**_: Any) -> float:
    return _queue().check()
