"""One reconcile of one job: read (job, its ConfigMap when needed, its pods), decide
(pure, decide.py), act (create / delete children, patch status, post Events).

Called by every kopf handler and the progress timer; a per-job lock serialises them
so two triggers never act on the same job at once inside one operator process.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf
from disttrain_api import constants as c
from disttrain_api.model import SpecError, parse_spec
from disttrain_api.validation import load_job

from . import opmetrics, progress, topology
from .decide import RUNNING, Observed, Plan, decide
from .kube import Kube
from .observe import pod_view
from .settings import OperatorSettings
from .topology.common import BuildContext, config_map_name

log = logging.getLogger("disttrain.operator")
EventFn = Callable[[dict[str, Any], str, str, str], None]

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def forget(namespace: str, name: str, uid: str) -> None:
    with _locks_guard:
        _locks.pop((namespace, name), None)
    opmetrics.set_phase(uid, None)


def _spec_error(err: SpecError) -> str:
    return "; ".join(f"{e.path}: {e.message}" for e in err.errors)


def _accepted_spec(kube: Kube, job: dict[str, Any], status: dict[str, Any]) -> Any:
    """The spec the existing gang runs (its ConfigMap); read only when the spec may have changed."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    if not status.get("phase") or status.get("phase") == "Failed" and not status.get("replicas"):
        return None
    refused = any(
        cond.get("type") == "InvalidSpec" and cond.get("status") == "True" and cond.get("reason") == "ImmutableFieldChanged"
        for cond in status.get("conditions") or []
    )
    if status.get("observedGeneration") == job["metadata"].get("generation") and not refused:
        return "unchanged"
    cm = kube.read_config_map(ns, config_map_name(name))
    if not cm:
        return None
    try:
        return parse_spec(json.loads((cm.get("data") or {}).get(c.CONFIG_FILENAME, "{}")))
    except (SpecError, ValueError):
        return None


def reconcile(
    kube: Kube, settings: OperatorSettings, namespace: str, name: str, event: EventFn, *, wait: bool = True
) -> Plan | None:
    """One reconcile. wait=False (the timer): skip when another one for this job is running,
    instead of parking a worker thread on the lock while other jobs wait for threads."""
    lock = _lock(namespace, name)
    if not lock.acquire(blocking=wait):
        return None
    start = time.perf_counter()
    try:
        return _reconcile(kube, settings, namespace, name, event)
    except Exception:
        opmetrics.RECONCILE_ERRORS.inc()
        raise
    finally:
        lock.release()
        opmetrics.RECONCILE_SECONDS.observe(time.perf_counter() - start)


def _reconcile(kube: Kube, settings: OperatorSettings, namespace: str, name: str, event: EventFn) -> Plan | None:
    # A fresh read, not kopf's cached body: our own last status patch must be visible,
    # or a restart could be counted twice.
    job = kube.get_job(namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None
    meta = job["metadata"]
    status = dict(job.get("status") or {})
    status.pop("kopf", None)
    now = datetime.now(UTC)
    spec, error = None, ""
    try:
        spec = load_job(job).spec
    except SpecError as err:
        error = _spec_error(err)
    accepted = None
    if spec is not None:
        found = _accepted_spec(kube, job, status)
        accepted = spec if found == "unchanged" else found
    mode = (accepted or spec).mode if (accepted or spec) else "data"
    role = topology.gang_role(mode)
    pods = kube.list_pods(namespace, f"{c.LABEL_JOB}={name},{c.LABEL_ROLE}={role}")
    views = [pod_view(p, now) for p in pods]

    prog = None
    if spec is not None and status.get("phase") == RUNNING:
        attempt = max([int(status.get("attempt") or 0), *(v.attempt for v in views)])
        rank0 = next((v for v in views if v.index == 0 and v.attempt == attempt and v.phase == "Running"), None)
        if rank0 is not None:
            prog = progress.scrape(rank0.ip, spec.metrics.port, settings.scrape_timeout_s)

    plan = decide(Observed(
        generation=int(meta.get("generation") or 0),
        spec=spec,
        spec_error=error,
        accepted=accepted,
        status=status,
        pods=views,
        progress=prog,
        now=now,
        force_delete_after_s=settings.force_delete_after_s,
        node_lost_after_s=settings.node_lost_after_s,
    ))
    _apply(kube, settings, job, status, plan, event)
    return plan


def _apply(
    kube: Kube, settings: OperatorSettings, job: dict[str, Any], old: dict[str, Any], plan: Plan, event: EventFn
) -> None:
    meta = job["metadata"]
    ns, name = meta["namespace"], meta["name"]
    new = plan.status
    restarting = int(new.get("attempt") or 0) > int(old.get("attempt") or 0) and not plan.create

    def patch_status() -> None:
        if new != old:
            kube.patch_job_status(ns, name, new)

    if restarting:  # status first: a crash after it re-deletes, never re-counts
        patch_status()
        reason = next((cond["reason"] for cond in new["conditions"] if cond["type"] == "Restarting"), "Restart")
        opmetrics.RESTARTS.labels(reason=reason).inc()
    if plan.create and plan.spec is not None:
        ctx = BuildContext(
            name=name,
            namespace=ns,
            uid=meta["uid"],
            image=plan.spec.image or settings.default_image,
            image_pull_policy=settings.image_pull_policy,
            attempt=int(new.get("attempt") or 0),
            replicas=int(new.get("replicas") or plan.spec.workers.replicas),
            termination_grace_s=settings.termination_grace_s,
            gpu=settings.gpu,
            allow_cpu_fallback=settings.allow_cpu_fallback,
        )
        children = topology.build_children(plan.spec, ctx)
        for obj in children.all():
            # Builders already set the controller reference; kopf.adopt keeps the kopf idiom
            # (idempotent for our own reference) and copies the job's labels to its children.
            kopf.adopt(obj, owner=job)
        for cm in children.config_maps:
            kube.replace_config_map(cm)
        for obj in [*children.services, *children.deployments, *children.pods]:
            kube.create(obj)
    for pod in plan.force_delete_pods:
        kube.delete_pod(ns, pod, force=True)
    for pod in plan.delete_pods:
        if pod not in plan.force_delete_pods:
            kube.delete_pod(ns, pod)
    if plan.delete_servers and plan.spec is not None and plan.spec.mode in ("federated", "paramserver"):
        kube.delete_deployments(ns, f"{c.LABEL_JOB}={name}")
    if not restarting:
        patch_status()
    for type_, reason, message in plan.events:
        log.info("%s/%s: %s %s: %s", ns, name, type_, reason, message)
        event(job, type_, reason, message)
    opmetrics.set_phase(meta["uid"], new.get("phase"))
    if plan.delete_job:
        event(job, "Normal", "TTLExpired", "ttlSecondsAfterFinished expired: deleting the job")
        kube.delete_job(ns, name)
