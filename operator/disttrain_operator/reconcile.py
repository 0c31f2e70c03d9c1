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

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf
from disttrain_api import constants as c
from disttrain_api.checkpoint_storage import claim_name, uses_default_claim
from disttrain_api.model import SpecError, parse_spec
from disttrain_api.validation import load_job

from . import job_secrets, opmetrics, topology
from .blocked import creation_blocked
from .cache import JobCache, JobKey
from .creation import Outcome, create_children, delete_servers
from .decide import decide, needs_recheck
from .decision import PENDING, RUNNING, Observed, Plan
from .expectations import Expectations
from .kube import Conflict, Kube
from .observe import ClaimView, PodView, claim_view, controller_of, pod_view
from .scraper import Endpoint, ProgressScraper
from .settings import OperatorSettings
from .statusdiff import ProgressWrites, merge_patch, progress_only
from .topology import credentials
from .topology.common import BuildContext, Children, config_map_name
from .topology.served import server_name

log = logging.getLogger("disttrain.operator")
EventFn = Callable[[dict[str, Any], str, str, str], None]
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
    if not cm or (controller_of(cm) or {}).get("uid") != job["metadata"]["uid"]:
        return None  # none, or not this job's (anyone may create a ConfigMap of that name): never read
    try:
        return parse_spec(json.loads((cm.get("data") or {}).get(c.CONFIG_FILENAME, "{}")))
    except (SpecError, ValueError):
        return None


class Reconciler:
    """Everything one reconcile needs besides the job's key and pods; called by the work
    queue with a snapshot of the job's pods (slim pod dicts, observe.slim_pod)."""

    def __init__(self, kube: Kube, settings: OperatorSettings, jobs: JobCache, scraper: ProgressScraper,
                 event: EventFn) -> None:
        self.kube, self.settings, self.jobs, self.scraper, self.event = kube, settings, jobs, scraper, event
        self.expect = Expectations()
        self.progress_writes = ProgressWrites(max(settings.poll_interval_s, settings.progress_interval_s))
        self._create_retries: dict[JobKey, int] = {}  # blocked creations in a row
        self._claims_bound: set[str] = set()  # UIDs of jobs whose checkpoint claim was seen Bound

    def forget(self, key: JobKey, uid: str) -> None:
        self.expect.forget(key)
        self.progress_writes.forget(key)
        self._create_retries.pop(key, None)
        self._claims_bound.discard(uid)
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

        source = (_progress_source(mode, status, views, all_views, key, meta["uid"], any_replica=effective.fault_tolerant)
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
            tls_renew_before_s=settings.tls_renew_before_s,
            claim=self._claim(job, effective, status, views, now),
            claim_pending_after_s=settings.claim_pending_after_s,
        )
        plan = decide(obs)
        # Scrape the pod that reports progress while the job runs, from the reconcile that
        # decides it runs: that reconcile's own status write may be the job's last watch event
        # for a long time (steady pods send none), and the first reading triggers the next one.
        run = plan.spec
        source = (_progress_source(mode, plan.status, views, all_views, key, meta["uid"], any_replica=run.fault_tolerant)
                  if run is not None else None)  # fmt: skip
        self.scraper.target(key, Endpoint(source.ip, run.metrics.port) if source and source.ip and run else None)
        servers_seen = any(v.role in (c.ROLE_AGGREGATOR, c.ROLE_SERVER, c.ROLE_LIGHTHOUSE) for v in all_views)
        again = self._apply(key, job, status, plan, views, servers_seen, mono)
        if needs_recheck(obs, plan):
            again = min(again if again is not None else settings.poll_interval_s, settings.poll_interval_s)
        if run is not None and plan.status.get("phase") in (PENDING, RUNNING) and (
            renew := job_secrets.seconds_until_due(run, plan.status, now, settings.tls_renew_before_s)
        ) is not None:  # the clock alone makes the certificate due (decided in these phases): no event says so
            again = min(again if again is not None else renew, max(renew, settings.poll_interval_s))
        return again

    def _claim(self, job: dict[str, Any], spec: Any, status: dict[str, Any], pods: list[PodView], now: datetime
               ) -> ClaimView | None:  # fmt: skip
        """The job's own checkpoint claim while its created gang cannot be scheduled (an unbound
        claim is the usual reason), until it is seen Bound: a gang that starts costs no read, and
        a bound claim stays bound."""
        uid = job["metadata"]["uid"]
        if spec is None or not uses_default_claim(spec) or uid in self._claims_bound:
            return None
        if not any(p.unschedulable_message for p in pods):
            return None
        created = any(cond.get("type") == "Created" and cond.get("status") == "True"
                      for cond in status.get("conditions") or [])
        if status.get("phase") != PENDING or not created:
            return None
        probe = {"kind": "PersistentVolumeClaim",
                 "metadata": {"namespace": job["metadata"]["namespace"], "name": claim_name(job["metadata"]["name"])}}
        live = self.kube.get(probe)
        if live is None:
            return None
        view = claim_view(live, now)
        if view.phase == "Bound":
            self._claims_bound.add(uid)
        return view

    def _apply(self, key: JobKey, job: dict[str, Any], old: dict[str, Any], plan: Plan, pods: list[PodView],
               servers_seen: bool, mono: float) -> float | None:
        """Act on the plan; at most one status write. Returns seconds until a deferred progress
        write or the next try of a blocked creation is due, else None."""
        kube = self.kube
        meta = job["metadata"]
        ns, name = key
        restarting = (int(plan.status.get("attempt") or 0) > int(old.get("attempt") or 0) and not plan.create
                      and not plan.mint_secrets)  # a resume creates (or mints for) the gang: no restart
        retry: float | None = None
        if plan.mint_secrets and plan.spec is not None:
            plan, retry = self._mint(key, job, old, plan, pods)
        elif plan.create and plan.spec is not None:
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
        uids = {p.name: p.uid for p in pods if p.uid}
        gone = self.expect.already_deleted(key, mono)
        # Deletes name the pod the decision saw (its UID, a precondition): never a same-named successor.
        for pod in plan.force_delete_pods:
            if pod in uids:
                kube.delete_pod(ns, pod, uids[pod], force=True)
        # A pod deleted by an earlier reconcile whose watch event has not arrived yet is not
        # deleted again.
        doomed = [pod for pod in plan.delete_pods if pod not in plan.force_delete_pods and pod in uids
                  and uids[pod] not in gone]  # fmt: skip
        kube.each(lambda pod: kube.delete_pod(ns, pod, uids[pod]), doomed)
        self.expect.expect_deleted(key, [uids[p] for p in doomed], mono)
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
            kube.delete_job(ns, name, meta["uid"])
        if retry is not None:
            return retry if deferred is None else min(retry, deferred)
        return deferred

    def _context(self, job: dict[str, Any], plan: Plan, secret_names: dict[str, str]) -> BuildContext:
        settings, meta, new = self.settings, job["metadata"], plan.status
        assert plan.spec is not None
        return BuildContext(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            image=settings.trainer_image(plan.spec.image, plan.spec.workers.resources.gpus),
            image_pull_policy=settings.image_pull_policy,
            attempt=int(new.get("attempt") or 0),
            replicas=int(new.get("replicas") or plan.spec.workers.replicas),
            gpu=settings.gpu,
            allow_cpu_fallback=settings.allow_cpu_fallback,
            secret_names=secret_names,
            tls_valid_s=settings.tls_valid_s,
            checkpoint_storage_class=settings.checkpoint_storage_class,
        )

    def _mint(self, key: JobKey, job: dict[str, Any], old: dict[str, Any], plan: Plan, pods: list[PodView]
              ) -> tuple[Plan, float | None]:  # fmt: skip
        """Create the Secrets plan.mint_secrets names under fresh random names and record those the
        API server created (201) in the plan's status (job_secrets.py); reconcile again at once,
        to create the gang that mounts them. A fresh name already taken (409: someone created
        it meanwhile) is simply not recorded: the next reconcile mints another."""
        assert plan.spec is not None
        name = job["metadata"]["name"]
        fresh = {purpose: credentials.fresh_secret_name(name, purpose) for purpose in plan.mint_secrets}
        ctx = self._context(job, plan, {**job_secrets.recorded(plan.status), **fresh})
        wanted = [s for s in topology.build_children(plan.spec, ctx).secrets if s["metadata"]["name"] in fresh.values()]
        for secret in wanted:
            kopf.adopt(secret, owner=job)
        outcome = create_children(self.kube, Children(secrets=wanted), job)
        status = copy.deepcopy(plan.status)
        by_name = {s["metadata"]["name"]: s for s in wanted}
        for purpose, secret_name in fresh.items():
            if secret_name in outcome.created:
                job_secrets.record(status, purpose, secret_name,
                                   credentials.not_after(by_name[secret_name]) if purpose == credentials.TLS else None)
                log.info("%s/%s: created Secret %s (%s)", *key, secret_name, purpose)
            elif secret_name in outcome.existing:
                log.warning("%s/%s: Secret %s existed before the operator created it: not the job's, never "
                            "mounted; minting another name", *key, secret_name)
        plan = dataclasses.replace(plan, status=status)
        if outcome.rejected:
            return self._blocked(key, job, old, plan, pods, outcome)
        self._create_retries.pop(key, None)
        return plan, (0.0 if len(outcome.created) == len(fresh) else self.settings.poll_interval_s)

    def _create(self, key: JobKey, job: dict[str, Any], old: dict[str, Any], plan: Plan, pods: list[PodView]
                ) -> tuple[Plan, float | None]:  # fmt: skip
        """Create the planned children; when something stops it, the plan to act on instead
        (blocked.py) and the seconds until the next try (backoff), else (plan, None). The
        Secrets are not among them: _mint created them, and the pods mount the names recorded."""
        assert plan.spec is not None
        names = job_secrets.recorded(plan.status)
        if missing := [p for p in job_secrets.needed(plan.spec) if p not in names]:  # decide() mints first
            raise RuntimeError(f"{key[0]}/{key[1]}: no recorded {', '.join(missing)} Secret to mount")
        children = dataclasses.replace(topology.build_children(plan.spec, self._context(job, plan, names)), secrets=[])
        for obj in children.all():
            # Builders already set the controller reference; kopf.adopt keeps the kopf idiom
            # (idempotent for our own reference) and copies the job's labels to its children.
            # A retained checkpoint claim has no owner on purpose: it outlives the job.
            if obj["metadata"].get("ownerReferences"):
                kopf.adopt(obj, owner=job)
        self.expect.expect_created(key, [p["metadata"]["name"] for p in children.pods], time.monotonic())
        outcome = create_children(self.kube, children, job)
        if outcome.done:
            self._create_retries.pop(key, None)
            return plan, None
        # Nothing recorded as created: a later reconcile plans the creation again.
        self.expect.forget(key)
        return self._blocked(key, job, old, plan, pods, outcome)

    def _blocked(self, key: JobKey, job: dict[str, Any], old: dict[str, Any], plan: Plan, pods: list[PodView],
                 outcome: Outcome) -> tuple[Plan, float | None]:  # fmt: skip
        """The status of a creation something stopped (blocked.py), and when to try again (backoff)."""
        settings = self.settings
        tries = self._create_retries[key] = self._create_retries.get(key, 0) + 1
        for what in (*outcome.conflicts, *outcome.rejected, *outcome.waiting):
            log.info("%s/%s: creation blocked (try %d): %s", *key, tries, what)
        ours = [p.name for p in pods if p.owner_uid == job["metadata"]["uid"] and not p.deleting]
        blocked, left = creation_blocked(plan, old, datetime.now(UTC), outcome, ours)
        delay = min(settings.poll_interval_s * 2 ** (tries - 1), MAX_CREATE_RETRY_S)
        if not outcome.conflicts and not outcome.rejected:
            delay = settings.poll_interval_s  # only the garbage collector to wait for: soon
        if left is not None:
            delay = min(delay, max(left, 0.5))  # fail on time
        return blocked, delay


def _progress_source(mode: str, status: dict[str, Any], views: list[PodView], all_views: list[PodView],
                     key: JobKey, uid: str, *, any_replica: bool = False) -> PodView | None:  # fmt: skip
    """The running pod whose metrics endpoint tells the job's progress, if the job runs: one of the
    job's own (a pod that merely carries the job's labels is never read); with `any_replica`
    (fault-tolerant replicas, which go on when pod 0 is lost) the lowest-index one."""
    if status.get("phase") != RUNNING:
        return None
    ours = [v for v in views if v.owner_uid == uid]
    attempt = max([int(status.get("attempt") or 0), *(v.attempt for v in ours)])
    if mode == "federated":
        # Rounds are counted (and checkpointed) by the aggregator, not by client 0. Its pod's
        # controller is the ReplicaSet of the job's aggregator Deployment.
        replica_sets = f"{server_name(key[1], c.ROLE_AGGREGATOR)}-"
        return next((v for v in all_views if v.role == c.ROLE_AGGREGATOR and v.phase == "Running"
                     and not v.deleting and v.owner_kind == "ReplicaSet" and v.owner_name.startswith(replica_sets)),
                    None)  # fmt: skip
    if any_replica:
        return min((v for v in ours if v.attempt == attempt and v.phase == "Running" and not v.deleting),
                   key=lambda v: v.index, default=None)  # fmt: skip
    return next((v for v in ours if v.index == 0 and v.attempt == attempt and v.phase == "Running"), None)
