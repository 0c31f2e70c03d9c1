"""One reconcile of one job: read (the job from the watch-fed cache, its pods from the
watch-fed index, rank 0's last progress reading; the ConfigMap only when the spec may have
changed or is invalid), decide (pure, decide.py), act (create children (creation.py; a
blocked creation becomes blocked.py's status, retried with backoff), delete the job's own
pods and servers, patch status, post Events).

The work queue (workqueue.py) runs at most one reconcile per job at a time. The caches lag
the API by a watch event, so the glue keeps two promises a fresh LIST used to keep:
- a pod this operator just created counts as existing until the watch shows it
  (`Expectations`), or a gang would look "vanished" right after its creation;
- the status is written as a merge patch conditional on the resourceVersion the decision
  was made from: a stale decision is refused (409) and made again from a fresh read,
  never written over a newer state.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from disttrain_api import constants as c
from disttrain_api.model import SpecError, parse_spec
from disttrain_api.validation import load_job

from . import opmetrics, topology
from .blocked import creation_blocked
from .cache import JobCache, JobKey
from .creation import create_children, delete_servers
from .decide import decide, needs_recheck
from .decision import PENDING, RUNNING, Observed, Plan
from .kube import Conflict, Kube
from .observe import PodView, pod_view
from .scraper import Endpoint, ProgressScraper
from .settings import OperatorSettings
from .statusdiff import ProgressWrites, merge_patch, progress_only
from .topology.common import BuildContext, config_map_name

log = logging.getLogger("disttrain.operator")
EventFn = Callable[[dict[str, Any], str, str, str], None]
# How long a created pod that the watch has not shown yet still counts as existing.
EXPECT_TIMEOUT_S = 30.0
# A blocked creation (a name held by another object, a child the API server rejects) is
# tried again after the poll interval, doubling up to this.
MAX_CREATE_RETRY_S = 60.0


def _spec_error(err: SpecError) -> str:
    return "; ".join(f"{e.path}: {e.message}" for e in err.errors)


def _accepted_spec(kube: Kube, job: dict[str, Any], status: dict[str, Any], *, valid: bool) -> Any:
    """The spec the existing gang runs (its ConfigMap); read only when the spec may have
    changed, or when it is invalid (the job then goes on with this one)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    if not status.get("phase") or status.get("phase") == "Failed" and not status.get("replicas"):
        return None
    refused = any(
        cond.get("type") == "InvalidSpec" and cond.get("status") == "True" and cond.get("reason") == "ImmutableFieldChanged"
        for cond in status.get("conditions") or []
    )
    if valid and status.get("observedGeneration") == job["metadata"].get("generation") and not refused:
        return "unchanged"
    cm = kube.read_config_map(ns, config_map_name(name))
    if not cm:
        return None
    try:
        return parse_spec(json.loads((cm.get("data") or {}).get(c.CONFIG_FILENAME, "{}")))
    except (SpecError, ValueError):
        return None


@dataclass
class Expectations:
    """Pods created or deleted by this operator whose watch event has not arrived yet, per job."""

    created: dict[JobKey, tuple[frozenset[str], float]] = field(default_factory=dict)
    deleted: dict[JobKey, dict[str, float]] = field(default_factory=dict)  # pod uid -> when
    guard: threading.Lock = field(default_factory=threading.Lock)

    def expect_created(self, key: JobKey, names: list[str], now: float) -> None:
        with self.guard:
            self.created[key] = (frozenset(names), now + EXPECT_TIMEOUT_S)

    def waiting_for(self, key: JobKey, seen: set[str], now: float) -> frozenset[str]:
        """Created pods not seen yet; empty (and forgotten) once all are seen or too late."""
        with self.guard:
            names, until = self.created.get(key, (frozenset(), 0.0))
            missing = names - seen
            if not missing or now >= until:
                self.created.pop(key, None)
                return frozenset()
            return missing

    def expect_deleted(self, key: JobKey, uids: list[str], now: float) -> None:
        with self.guard:
            mine = self.deleted.setdefault(key, {})
            for uid in uids:
                mine[uid] = now + EXPECT_TIMEOUT_S

    def already_deleted(self, key: JobKey, now: float) -> set[str]:
        with self.guard:
            mine = self.deleted.get(key, {})
            for uid in [u for u, until in mine.items() if now >= until]:
                del mine[uid]
            return set(mine)

    def forget(self, key: JobKey) -> None:
        with self.guard:
            self.created.pop(key, None)
            self.deleted.pop(key, None)


class Reconciler:
    """Everything one reconcile needs besides the job's key and pods; called by the work
    queue with a snapshot of the job's pods (slim pod dicts, observe.slim_pod)."""

    def __init__(self, kube: Kube, settings: OperatorSettings, jobs: JobCache, scraper: ProgressScraper,
                 event: EventFn) -> None:
        self.kube, self.settings, self.jobs, self.scraper, self.event = kube, settings, jobs, scraper, event
        self.expect = Expectations()
        self.progress_writes = ProgressWrites(max(settings.poll_interval_s, settings.progress_interval_s))
        self._create_retries: dict[JobKey, int] = {}  # blocked creations in a row

    def forget(self, key: JobKey, uid: str) -> None:
        self.expect.forget(key)
        self.progress_writes.forget(key)
        self._create_retries.pop(key, None)
        self.scraper.target(key, None)
        opmetrics.set_phase(uid, None)

    def __call__(self, key: JobKey, pods: list[dict[str, Any]]) -> float | None:
        """One reconcile; returns seconds until the job must be reconciled again without an
        event (None: only on the next event)."""
        start = time.perf_counter()
        try:
            return self._reconcile(key, pods)
        except Conflict as err:
            # The fresh job is in the cache already (_apply): decide again at once.
            log.debug("%s/%s: stale status write refused, reconciling again: %s", *key, err)
            return 0.0
        except Exception:
            opmetrics.RECONCILE_ERRORS.inc()
            raise
        finally:
            opmetrics.RECONCILE_SECONDS.observe(time.perf_counter() - start)

    def _reconcile(self, key: JobKey, raw_pods: list[dict[str, Any]]) -> float | None:
        kube, settings = self.kube, self.settings
        namespace, name = key
        job = self.jobs.get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            self.scraper.target(key, None)
            return None
        meta = job["metadata"]
        status = dict(job.get("status") or {})
        status.pop("kopf", None)
        now, mono = datetime.now(UTC), time.monotonic()
        pending = self.expect.waiting_for(key, {(p.get("metadata") or {}).get("name", "") for p in raw_pods}, mono)
        if pending:
            # Just created; their ADDED events are on the way (and will trigger a reconcile).
            return 1.0
        spec, error = None, ""
        try:
            spec = load_job(job).spec
        except SpecError as err:
            error = _spec_error(err)
        found = _accepted_spec(kube, job, status, valid=spec is not None)
        accepted = spec if found == "unchanged" else found
        effective = spec or accepted
        mode = effective.mode if effective else "data"
        role = topology.gang_role(mode)
        all_views = [pod_view(p, now) for p in raw_pods]
        views = [v for v in all_views if v.role == role]

        source = (_progress_source(mode, status, views, all_views, any_replica=effective.fault_tolerant)
                  if effective is not None else None)  # fmt: skip
        prog = self.scraper.latest(key) if source is not None else None
        taken = self.scraper.taken_at(key) if prog is not None else None

        obs = Observed(
            generation=int(meta.get("generation") or 0),
            name=name,
            uid=meta["uid"],
            spec=spec,
            spec_error=error,
            accepted=accepted,
            status=status,
            pods=views,
            progress=prog,
            progress_time=datetime.fromtimestamp(taken, UTC) if taken is not None else None,
            now=now,
            force_delete_after_s=settings.force_delete_after_s,
            node_lost_after_s=settings.node_lost_after_s,
            deleted_by_operator=frozenset(self.expect.already_deleted(key, mono)),
        )
        plan = decide(obs)
        # Scrape the pod that reports progress while the job runs, from the reconcile that
        # decides it runs: that reconcile's own status write may be the job's last watch event
        # for a long time (steady pods send none), and the first reading triggers the next one.
        run = plan.spec
        source = (_progress_source(mode, plan.status, views, all_views, any_replica=run.fault_tolerant)
                  if run is not None else None)  # fmt: skip
        self.scraper.target(key, Endpoint(source.ip, run.metrics.port) if source and source.ip and run else None)
        servers_seen = any(v.role in (c.ROLE_AGGREGATOR, c.ROLE_SERVER, c.ROLE_LIGHTHOUSE) for v in all_views)
        again = self._apply(key, job, status, plan, views, servers_seen, mono)
        if needs_recheck(obs, plan):
            again = min(again if again is not None else settings.poll_interval_s, settings.poll_interval_s)
        return again

    def _apply(self, key: JobKey, job: dict[str, Any], old: dict[str, Any], plan: Plan, pods: list[PodView],
               servers_seen: bool, mono: float) -> float | None:
        """Act on the plan; at most one status write. Returns seconds until a deferred progress
        write or the next try of a blocked creation is due, else None."""
        kube = self.kube
        meta = job["metadata"]
        ns, name = key
        restarting = int(plan.status.get("attempt") or 0) > int(old.get("attempt") or 0) and not plan.create
        retry: float | None = None
        if plan.create and plan.spec is not None:
            plan, retry = self._create(key, job, old, plan, pods)
        new = plan.status
        patch = merge_patch(old, new)
        deferred: float | None = None
        if not patch:
            self.progress_writes.undone(key)  # a deferred change undone before its write
        elif progress_only(patch):
            if old.get("phase") == PENDING and new.get("phase") == PENDING:
                # Pod counts of a gang that is starting: carried by the next transition (Running,
                # or why it cannot start), not written one pod at a time.
                patch = {}
            else:
                # Counts and progress of a running job: at most one write per interval, the
                # latest, and none until the change is an interval old: pods that finish within
                # an interval of each other are carried by the Succeeded write that follows.
                wait = self.progress_writes.wait_s(key, mono)
                if wait > 0:
                    patch, deferred = {}, wait

        def write_status() -> None:
            if not patch:
                return
            try:
                body = kube.patch_job_status(ns, name, patch, meta["resourceVersion"])
            except Conflict:
                # Decided from an older job than the API has (a spec edit, a lagging watch):
                # read it again and decide again; nothing of this plan has been done yet.
                fresh = kube.get_job(ns, name)
                if fresh is not None:
                    self.jobs.put(key, fresh)
                else:
                    self.jobs.drop(key, meta["uid"])
                raise
            self.jobs.put(key, body)
            self.progress_writes.written(key, time.monotonic())  # the next progress change waits anew
            opmetrics.STATUS_WRITES.labels(kind="progress" if progress_only(patch) else "transition").inc()

        if restarting:  # status first: a crash after it re-deletes, never re-counts
            write_status()
            reason = next((cond["reason"] for cond in new["conditions"] if cond["type"] == "Restarting"), "Restart")
            opmetrics.RESTARTS.labels(reason=reason).inc()
        uids = {p.name: p.uid for p in pods}
        gone = self.expect.already_deleted(key, mono)
        # Deletes name the pod the decision saw (its UID): never a same-named successor.
        for pod in plan.force_delete_pods:
            kube.delete_pod(ns, pod, uids.get(pod, ""), force=True)
        # A pod deleted by an earlier reconcile whose watch event has not arrived yet is not
        # deleted again.
        doomed = [pod for pod in plan.delete_pods if pod not in plan.force_delete_pods and uids.get(pod) not in gone]
        kube.each(lambda pod: kube.delete_pod(ns, pod, uids.get(pod, "")), doomed)
        self.expect.expect_deleted(key, [uids[p] for p in doomed if uids.get(p)], mono)
        if (plan.delete_servers and plan.spec is not None and topology.server_deployments(plan.spec, name)
                and (servers_seen or patch)):
            delete_servers(kube, plan.spec, job)
        if not restarting:
            write_status()
        for type_, reason, message in plan.events:
            log.info("%s/%s: %s %s: %s", ns, name, type_, reason, message)
            self.event(job, type_, reason, message)
            if (counter := opmetrics.FT_EVENTS.get(reason)) is not None:
                counter.labels(namespace=ns, job=name).inc()
        opmetrics.set_phase(meta["uid"], new.get("phase"))
        if plan.delete_job:
            self.event(job, "Normal", "TTLExpired", "ttlSecondsAfterFinished expired: deleting the job")
            kube.delete_job(ns, name)
        if retry is not None:
            return retry if deferred is None else min(retry, deferred)
        return deferred

    def _create(self, key: JobKey, job: dict[str, Any], old: dict[str, Any], plan: Plan, pods: list[PodView]
                ) -> tuple[Plan, float | None]:  # fmt: skip
        """Create the planned children; when something stops it, the plan to act on instead
        (blocked.py) and the seconds until the next try (backoff), else (plan, None)."""
        settings, meta, new = self.settings, job["metadata"], plan.status
        assert plan.spec is not None
        ctx = BuildContext(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            image=plan.spec.image or settings.default_image,
            image_pull_policy=settings.image_pull_policy,
            attempt=int(new.get("attempt") or 0),
            replicas=int(new.get("replicas") or plan.spec.workers.replicas),
            gpu=settings.gpu,
            allow_cpu_fallback=settings.allow_cpu_fallback,
        )
        children = topology.build_children(plan.spec, ctx)
        for obj in children.all():
            # Builders already set the controller reference; kopf.adopt keeps the kopf idiom
            # (idempotent for our own reference) and copies the job's labels to its children.
            kopf.adopt(obj, owner=job)
        self.expect.expect_created(key, [p["metadata"]["name"] for p in children.pods], time.monotonic())
        outcome = create_children(self.kube, children, job)
        if outcome.done:
            self._create_retries.pop(key, None)
            return plan, None
        # Nothing recorded as created: a later reconcile plans the creation again.
        self.expect.forget(key)
        tries = self._create_retries[key] = self._create_retries.get(key, 0) + 1
        for what in (*outcome.conflicts, *outcome.rejected, *outcome.waiting):
            log.info("%s/%s: creation blocked (try %d): %s", *key, tries, what)
        ours = [p.name for p in pods if p.owner_uid == meta["uid"] and not p.deleting]
        blocked, left = creation_blocked(plan, old, datetime.now(UTC), outcome, ours)
        delay = min(settings.poll_interval_s * 2 ** (tries - 1), MAX_CREATE_RETRY_S)
        if not outcome.conflicts and not outcome.rejected:
            delay = settings.poll_interval_s  # only the garbage collector to wait for: soon
        if left is not None:
            delay = min(delay, max(left, 0.5))  # fail on time
        return blocked, delay


def _progress_source(mode: str, status: dict[str, Any], views: list[PodView], all_views: list[PodView], *,
                     any_replica: bool = False) -> PodView | None:  # fmt: skip
    """The running pod whose metrics endpoint tells the job's progress, if the job runs; with
    `any_replica` (fault-tolerant replicas, which go on when pod 0 is lost) the lowest-index one."""
    if status.get("phase") != RUNNING:
        return None
    attempt = max([int(status.get("attempt") or 0), *(v.attempt for v in views)])
    if mode == "federated":
        # Rounds are counted (and checkpointed) by the aggregator, not by client 0.
        return next((v for v in all_views if v.role == c.ROLE_AGGREGATOR and v.phase == "Running"
                     and not v.deleting), None)
    if any_replica:
        return min((v for v in views if v.attempt == attempt and v.phase == "Running" and not v.deleting),
                   key=lambda v: v.index, default=None)  # fmt: skip
    return next((v for v in views if v.index == 0 and v.attempt == attempt and v.phase == "Running"), None)
