"""The event-driven reconcile path without a cluster: the work queue, the job cache, status
merge patches, progress scraping off the reconcile path, and a whole job's life through
`Reconciler` against a recording fake of the API (requests counted as the operator's
metric counts them)."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from disttrain_api import constants as c
from disttrain_api import metric_names as names
from disttrain_api.model import PLURAL
from disttrain_api.progress import PROGRESS_INTERVAL_S
from disttrain_api.scaling.hint import Proposal
from disttrain_operator.cache import JobCache
from disttrain_operator.kube import Conflict, Kube
from disttrain_operator.observe import pod_view, slim_pod
from disttrain_operator.progress import FORECAST
from disttrain_operator.reconcile import Reconciler
from disttrain_operator.scraper import Endpoint, ProgressScraper
from disttrain_operator.settings import OperatorSettings
from disttrain_operator.statusdiff import merge_patch, progress_only
from disttrain_operator.workqueue import WorkQueue
from kubernetes import client

# ---------------------------------------------------------------- work queue


def run_queue(reconcile: Any, body: Any, *, workers: int = 4, **kw: Any) -> None:
    async def main() -> None:
        queue = WorkQueue(reconcile, workers=workers, **kw)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            queue.start(pool)
            await body(queue)
            for task in queue._tasks:
                task.cancel()

    asyncio.run(main())


async def settle(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_queue_coalesces_events_and_never_runs_a_job_twice_at_once() -> None:
    calls: list[str] = []
    running: set[str] = set()
    overlap: list[str] = []
    gate = threading.Event()
    lock = threading.Lock()

    def reconcile(key: str, _: object) -> None:
        with lock:
            if key in running:
                overlap.append(key)
            running.add(key)
            calls.append(key)
        if key == "a" and calls.count("a") == 1:
            gate.wait(5)  # first reconcile of a is slow: events for a arrive meanwhile
        with lock:
            running.discard(key)

    async def body(queue: WorkQueue) -> None:
        for _ in range(5):
            queue.add("b")  # queued, not running: five events, one reconcile
        queue.add("a")
        await settle(lambda: "a" in running)
        for _ in range(5):
            queue.add("a")  # while a runs: exactly one more reconcile afterwards
        gate.set()
        await settle(lambda: calls.count("a") == 2 and "b" in calls and not len(queue))
        await asyncio.sleep(0.2)

    run_queue(reconcile, body)
    assert calls.count("a") == 2 and calls.count("b") == 1 and not overlap


def test_queue_runs_again_when_asked_and_backs_off_after_errors() -> None:
    times: dict[str, list[float]] = {"timer": [], "broken": []}

    def reconcile(key: str, _: object) -> float | None:
        times[key].append(time.monotonic())
        if key == "broken":
            raise RuntimeError("API server unreachable")
        return 0.3 if len(times[key]) < 3 else None

    async def body(queue: WorkQueue) -> None:
        queue.add("timer")
        queue.add("broken")
        await settle(lambda: len(times["timer"]) == 3 and len(times["broken"]) >= 2)
        await asyncio.sleep(0.5)

    run_queue(reconcile, body, error_backoff_s=0.2)
    timer = times["timer"]
    assert len(timer) == 3 and all(b - a >= 0.25 for a, b in zip(timer, timer[1:], strict=False))
    assert len(times["broken"]) >= 2  # the error did not drop the job, nor stop the workers


def test_queue_check_fails_when_workers_stop_or_hang() -> None:
    def reconcile(key: str, _: object) -> None:
        time.sleep(0.5)

    async def body(queue: WorkQueue) -> None:
        assert queue.check() == 0.0  # idle
        queue.add("a")
        queue.add("b")  # waits: one worker, busy with a
        await asyncio.sleep(0.05)
        queue.last_beat -= 300
        with pytest.raises(RuntimeError, match="no reconcile finished"):
            queue.check()
        for task in queue._tasks:
            task.cancel()
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="not running"):
            queue.check()

    run_queue(reconcile, body, workers=1)


def test_queue_hands_the_prepared_snapshot_to_the_reconcile() -> None:
    seen: list[tuple[str, object]] = []

    async def body(queue: WorkQueue) -> None:
        queue.add("a")
        await settle(lambda: bool(seen))

    run_queue(lambda key, snap: seen.append((key, snap)), body, prepare=lambda key: f"pods of {key}")
    assert seen == [("a", "pods of a")]


# ---------------------------------------------------------------- job cache


def job_at(rv: str, uid: str = "u1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "uid": uid, "resourceVersion": rv, "managedFields": [{"big": 1}]},
            "status": status}


def test_cache_keeps_the_newest_version_of_a_job() -> None:
    jobs = JobCache()
    assert jobs.put(("ns", "j"), job_at("10", phase="Running"))
    assert "managedFields" not in jobs.get(("ns", "j"))["metadata"]  # type: ignore[index]
    assert not jobs.put(("ns", "j"), job_at("9", phase="Pending"))  # a late watch event
    assert not jobs.put(("ns", "j"), job_at("10", phase="Running"))  # our own write coming back
    assert jobs.get(("ns", "j"))["status"]["phase"] == "Running"  # type: ignore[index]
    assert jobs.put(("ns", "j"), job_at("3", uid="u2"))  # a new job of the same name
    jobs.drop(("ns", "j"), "u1")  # the old one's DELETED event: not this one
    assert len(jobs) == 1
    jobs.drop(("ns", "j"), "u2")
    assert jobs.get(("ns", "j")) is None


# ---------------------------------------------------------------- status patches


def apply_merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies it."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def test_merge_patch_sends_only_changes_and_reproduces_the_new_status() -> None:
    old = {"phase": "Pending", "workers": {"active": 2, "pending": 2}, "conditions": [{"type": "Created"}],
           "message": "starting", "gone": 1}
    new = {"phase": "Running", "workers": {"active": 2, "pending": 0}, "conditions": [{"type": "Created"}],
           "message": "training", "startTime": "t"}
    patch = merge_patch(old, new)
    assert patch == {"phase": "Running", "workers": {"pending": 0}, "message": "training", "startTime": "t",
                     "gone": None}
    assert apply_merge(old, patch) == new
    assert merge_patch(new, new) == {}
    assert progress_only({"workers": {"pending": 1}, "step": 5}) and not progress_only(patch)
    assert not progress_only({})


# ---------------------------------------------------------------- progress scraping


def test_scraper_bounds_concurrency_and_rate_and_reports_changes() -> None:
    in_flight, peak, calls = [0], [0], []
    lock = threading.Lock()
    readings = {"10.0.0.1": [1.0, 1.0, 2.0]}

    def scrape(ip: str, port: int) -> dict[str, float] | None:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            calls.append(ip)
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        series = readings.get(ip)
        return {"disttrain_step": series.pop(0) if len(series) > 1 else series[0]} if series else None

    changed: list[str] = []

    async def main() -> None:
        scraper = ProgressScraper(scrape, changed.append, interval_s=0.3, concurrency=2)
        scraper.target("job-a", Endpoint("10.0.0.1", 9000))
        for i in range(6):
            scraper.target(f"quiet-{i}", Endpoint(f"10.0.1.{i}", 9000))  # unreachable: None
        scraper.start()
        await asyncio.sleep(1.0)
        assert scraper.task is not None
        scraper.task.cancel()
        assert scraper.latest("job-a") == {"disttrain_step": 2.0}
        scraper.target("job-a", None)
        assert scraper.latest("job-a") is None and len(scraper) == 6

    asyncio.run(main())
    assert peak[0] <= 2  # bounded over all jobs
    assert 2 <= calls.count("10.0.0.1") <= 4  # once per 0.3 s round, not back to back
    assert changed == ["job-a", "job-a"]  # 1.0 (new), 1.0 (same: no reconcile), 2.0


# ---------------------------------------------------------------- the reconcile, against a fake API

NS, NAME, UID = "ns", "bench", "uid-1"
KEY = (NS, NAME)


class FakeApi(Kube):
    """Kube whose requests go to an in-memory API: counts every request (verb, resource)
    exactly where the real one increments its metric."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.job = job
        self.calls: list[tuple[str, str]] = []
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.concurrent, self.peak = 0, 0
        self.waves = 0  # requests that started with none in flight: sequential round trips
        self.edit_before_patch = False
        self.delay = 0.02  # a round trip: concurrent requests overlap

    def request(self, method: str, path: str, *, resource: str, verb: str, query: Any = None, body: Any = None,
                content_type: str = "application/json", allow: tuple[int, ...] = ()) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls.append((verb, resource))
            self.waves += self.concurrent == 0
            self.concurrent += 1
            self.peak = max(self.peak, self.concurrent)
        try:
            time.sleep(self.delay)
            with self.lock:
                return self._answer(path, resource, verb, body)
        finally:
            with self.lock:
                self.concurrent -= 1

    def _answer(self, path: str, resource: str, verb: str, body: Any) -> tuple[int, dict[str, Any]]:
        if resource == PLURAL + "/status":
            if self.edit_before_patch:  # someone changed the job after the operator read it
                self.edit_before_patch = False
                self._bump()
            if body["metadata"]["resourceVersion"] != self.job["metadata"]["resourceVersion"]:
                raise Conflict(409, "PATCH", path, '{"message": "the object has been modified"}')
            self.job["status"] = apply_merge(self.job.get("status") or {}, body["status"])
            self._bump()
            return 200, copy.deepcopy(self.job)
        if resource == PLURAL and verb == "get":
            return 200, copy.deepcopy(self.job)
        if resource == "events":
            return 201, {}
        if verb == "create":
            key = (resource, body["metadata"]["name"])
            if key in self.objects:
                return 409, {}
            self.objects[key] = body
            return 201, body
        if verb == "get":
            key = (resource, path.rsplit("/", 1)[1])
            return (200, self.objects[key]) if key in self.objects else (404, {})
        return 200, {}

    def _bump(self) -> None:
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def pods(self, phase: str, **status: Any) -> list[dict[str, Any]]:
        """The created pods as the watch shows them, in `phase`."""
        out = []
        for (resource, _), obj in sorted(self.objects.items()):
            if resource == "pods":
                pod = copy.deepcopy(obj)
                pod["metadata"].update(uid=f"pod-{pod['metadata']['name']}", creationTimestamp="2026-01-01T00:00:00Z")
                pod["status"] = {"phase": phase, "podIP": "10.0.0.9", **status}
                out.append(slim_pod(pod))
        return out

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        return sum((verb is None or v == verb) and (resource is None or r == resource) for v, r in self.calls)


def new_job(workers: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1, "resourceVersion": "100"},
        "spec": {"mode": "data", "image": "img", "workers": {"replicas": workers}, "data": {"batchSize": 64 * workers},
                 "runPolicy": {"cleanPodPolicy": "None"}},
    }


def setup(workers: int = 4, interval: float = 3.0) -> tuple[FakeApi, JobCache, Reconciler, list[str]]:
    api = FakeApi(new_job(workers))
    jobs = JobCache()
    jobs.put(KEY, copy.deepcopy(api.job))
    reasons: list[str] = []
    scraper = ProgressScraper(lambda ip, port: None, lambda key: None, interval_s=interval)
    rec = Reconciler(api, OperatorSettings(poll_interval_s=interval, progress_interval_s=interval), jobs, scraper,
                     lambda job, type_, reason, message: (reasons.append(reason), api.post_event(job, type_, reason,
                                                                                                 message)))
    return api, jobs, rec, reasons


def succeeded(api: FakeApi) -> list[dict[str, Any]]:
    done = {"containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": "{}"}}}]}
    return api.pods("Succeeded", **done)


def test_a_job_to_completion_costs_its_creates_one_write_per_transition_and_one_event() -> None:
    api, jobs, rec, reasons = setup()
    api.delay = 0.1  # long enough for requests sent together to overlap
    rec(KEY, [])  # the job's ADDED event
    api.delay = 0.0
    assert api.count("create", "configmaps") == 1 and api.count("create", "services") == 1
    assert api.count("create", "networkpolicies") == 1  # created with the ConfigMap and Service, at once
    assert api.count("create", "persistentvolumeclaims") == 1  # the checkpoint claim, with them
    assert api.count("create", "pods") == 4 and api.peak >= 4  # the gang at once, not one by one
    # Round trips: ConfigMap + Service, then the pods, then status and Event: 4, not the 8 of
    # one request after the other.
    assert api.waves <= 4, api.waves
    # Our own status write is in the cache already; its watch event brings nothing new.
    assert not jobs.put(KEY, copy.deepcopy(api.job))
    assert rec(KEY, []) == 1.0  # pod events not seen yet: wait for them, never "vanished"
    for phase in ("Pending", "Pending", "Running", "Running"):  # a burst of pod events
        rec(KEY, api.pods(phase))
    rec(KEY, succeeded(api))
    rec(KEY, succeeded(api))  # the job's own MODIFIED event, or a late pod event: nothing to do
    assert api.job["status"]["phase"] == "Succeeded" and api.job["status"]["restarts"] == 0
    # Events say what the operator did (created the gang); Running and Succeeded are states the
    # job reached, recorded by its conditions.
    assert reasons == ["GangCreated"]
    assert api.count("patch") == 3  # Created, Running, Succeeded: one status write per transition
    assert api.count("list") == 0 and api.count("get") == 0  # no reads: the watches feed the caches
    assert len(api.calls) == 8 + 3 + 1  # <= 12 requests for a job without incident


def test_the_reconcile_that_makes_a_job_running_starts_scraping_its_progress() -> None:
    # Its own status write comes back as a watch event that triggers nothing, and steady pods
    # send none: if only a later reconcile named the endpoint, a running job's progress would
    # stay unread until its pods ended.
    api, _, rec, _ = setup(workers=2)
    rec(KEY, [])
    rec(KEY, api.pods("Pending"))
    assert rec.scraper.latest(KEY) is None and len(rec.scraper) == 0  # not running: nothing to scrape
    rec(KEY, api.pods("Running"))
    assert api.job["status"]["phase"] == "Running"
    assert len(rec.scraper) == 1  # rank 0's endpoint, named by the same reconcile
    rec(KEY, succeeded(api))
    assert api.job["status"]["phase"] == "Succeeded" and len(rec.scraper) == 0  # ended: scraping stops


def test_pod_counts_and_progress_alone_are_written_at_most_once_per_interval() -> None:
    api, _, rec, _ = setup(workers=2, interval=0.5)
    rec(KEY, [])
    writes, message = api.count("patch"), api.job["status"]["message"]
    # A starting gang: only the message ("2 of 2 pods starting") would change: the next
    # transition carries it.
    assert rec(KEY, api.pods("Pending")) is None
    assert api.count("patch") == writes and api.job["status"]["message"] == message
    rec(KEY, api.pods("Running"))  # a transition is written at once
    assert api.count("patch") == writes + 1 and api.job["status"]["phase"] == "Running"
    one_done = api.pods("Running")
    one_done[1]["status"]["phase"] = "Succeeded"  # counts change while the job runs: deferred
    again = rec(KEY, one_done)
    assert api.count("patch") == writes + 1 and again is not None and 0 < again <= 0.5
    assert rec(KEY, one_done) is not None and api.count("patch") == writes + 1  # more events: still deferred
    time.sleep(again)
    assert rec(KEY, one_done) is None  # due: written now, nothing left to wait for
    assert api.count("patch") == writes + 2 and api.job["status"]["workers"]["succeeded"] == 1


def test_progress_alone_waits_the_progress_interval_not_the_poll_interval() -> None:
    """The default settings: scraped every 3 s, a running job's progress written at most every 10 s."""
    api = FakeApi(new_job(2))
    jobs = JobCache()
    jobs.put(KEY, copy.deepcopy(api.job))
    scraper = ProgressScraper(lambda ip, port: None, lambda key: None, interval_s=3.0)
    settings = OperatorSettings()
    assert (settings.poll_interval_s, settings.progress_interval_s) == (3.0, PROGRESS_INTERVAL_S) == (3.0, 10.0)
    rec = Reconciler(api, settings, jobs, scraper, lambda job, type_, reason, message: None)
    rec(KEY, [])
    rec(KEY, api.pods("Running"))
    writes = api.count("patch")
    one_done = api.pods("Running")
    one_done[1]["status"]["phase"] = "Succeeded"
    again = rec(KEY, one_done)
    assert api.count("patch") == writes and again is not None and 9.0 < again <= 10.0


class AdvancingScraper(ProgressScraper):
    """Rank 0 one step further at every reading, and waiting on the link for 36-38% of its step
    with a forecast that names PowerSGD: the progress and the hint the reconciles see."""

    def __init__(self) -> None:
        super().__init__(lambda ip, port: None, lambda key: None, interval_s=1.0)
        self.step = 0
        self.proposal = Proposal(world_size=32, efficiency=0.5, change="dp32 powersgd", current="dp32", gain=0.4)

    def latest(self, key: Any) -> dict[str, Any] | None:
        if not len(self):
            return None
        self.step += 1
        return {names.STEP: float(self.step), names.COMM_EXPOSED_FRACTION: 0.38 - 0.01 * (self.step % 3),
                FORECAST: self.proposal}  # fmt: skip

    def taken_at(self, key: Any) -> float | None:
        return time.time()


def test_progress_from_a_32_worker_gang_is_written_at_most_once_per_interval_and_the_hint_once() -> None:
    """Every pod event of a 32-worker gang reconciles the job, and every reconcile reads a new
    step: the status PATCHes stay within one progress write per interval (plus the transitions),
    and the hint, a transition, is written and announced once."""
    interval = 0.2
    api = FakeApi(new_job(32))
    jobs = JobCache()
    jobs.put(KEY, copy.deepcopy(api.job))
    reasons: list[str] = []
    scraper = AdvancingScraper()
    rec = Reconciler(api, OperatorSettings(poll_interval_s=interval, progress_interval_s=interval), jobs, scraper,
                     lambda job, type_, reason, message: reasons.append(reason))  # fmt: skip
    api.delay = 0.0
    rec(KEY, [])
    running = api.pods("Running")
    rec(KEY, running)  # Running (a transition): scraping starts
    assert api.job["status"]["phase"] == "Running"
    writes, start = api.count("patch"), time.monotonic()
    reconciles = 0
    while time.monotonic() - start < 5 * interval:
        for _ in range(32):  # each worker's pod event
            rec(KEY, running)
            reconciles += 1
    elapsed = time.monotonic() - start
    progress_writes = api.count("patch") - writes - 1  # less the hint's own write
    assert reconciles >= 32 and scraper.step >= 32  # far more readings than writes
    # One write per interval at most (the first an interval after the Running write).
    assert 1 <= progress_writes <= elapsed / interval + 1, (progress_writes, elapsed)
    assert api.job["status"]["progress"]["completed"] >= progress_writes
    # The first reading's figure (step 1: 37%), kept while later ones move between 36 and 38%.
    assert api.job["status"]["hint"] == "exposed communication 37% of the step: dp32 powersgd forecast +40% samples/s over dp32"
    assert reasons.count("ScalingHint") == 1


def test_pods_finishing_within_an_interval_get_no_count_write_of_their_own() -> None:
    # The change waits an interval from when it was first seen (not from the last write): the
    # Succeeded write that follows carries the counts.
    api, _, rec, _ = setup(workers=2, interval=0.5)
    rec(KEY, [])
    rec(KEY, api.pods("Running"))
    writes = api.count("patch")
    time.sleep(0.6)  # an interval after the Running write
    one_done = api.pods("Running")
    one_done[1]["status"]["phase"] = "Succeeded"
    again = rec(KEY, one_done)
    assert again is not None and 0.4 < again <= 0.5 and api.count("patch") == writes
    rec(KEY, succeeded(api))  # the last pod ends within the interval: the transition carries all
    assert api.count("patch") == writes + 1 and api.job["status"]["phase"] == "Succeeded"
    assert api.job["status"]["workers"]["succeeded"] == 2
    assert rec(KEY, succeeded(api)) is None and api.count("patch") == writes + 1


def test_a_stale_decision_is_refused_and_made_again_from_a_fresh_read() -> None:
    api, jobs, rec, reasons = setup()
    rec(KEY, [])
    rec(KEY, api.pods("Running"))
    assert api.job["status"]["phase"] == "Running"
    failed = api.pods("Running")
    failed[1]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}
    api.edit_before_patch = True  # e.g. a user's label edit lands between our read and our write
    assert rec(KEY, failed) == 0.0  # refused: ask for an immediate new reconcile
    # Nothing acted on: no restart counted, no pod deleted, no Event.
    assert api.job["status"]["phase"] == "Running" and api.job["status"]["restarts"] == 0
    assert api.count("delete", "pods") == 0 and reasons == ["GangCreated"]
    assert jobs.get(KEY)["metadata"]["resourceVersion"] == api.job["metadata"]["resourceVersion"]  # type: ignore[index]
    rec(KEY, failed)
    assert api.job["status"]["phase"] == "Restarting" and api.job["status"]["restarts"] == 1
    assert api.count("delete", "pods") == 4 and reasons == ["GangCreated", "WorkerFailed"]


def test_a_restart_is_counted_once_and_pods_are_deleted_once() -> None:
    api, _, rec, _ = setup(workers=2)
    rec(KEY, [])
    rec(KEY, api.pods("Running"))
    failed = api.pods("Running")
    failed[1]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}
    rec(KEY, failed)
    assert api.job["status"]["restarts"] == 1 and api.job["status"]["attempt"] == 1
    deletes = api.count("delete", "pods")
    assert deletes == 2
    rec(KEY, failed)  # the deletions' watch events have not arrived yet
    assert api.job["status"]["restarts"] == 1 and api.count("delete", "pods") == deletes


def test_slim_pods_keep_everything_the_decision_reads() -> None:
    now = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    pod = {"metadata": {"name": "p", "uid": "u", "labels": {c.LABEL_ROLE: "worker", c.LABEL_REPLICA_INDEX: "0"},
                        "ownerReferences": [{"controller": True, "uid": UID, "kind": "DistTrainJob"}],
                        "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T00:00:30Z",
                        "managedFields": [{"x": 1}], "annotations": {"a": "b"}},
           "spec": {"containers": [{"name": "trainer"}]},
           "status": {"phase": "Running", "podIP": "10.1.1.1", "conditions": [
               {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:40Z"}],
               "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]}}
    slim = slim_pod(pod)
    assert "spec" not in slim and "managedFields" not in slim["metadata"]
    assert pod_view(slim, now) == pod_view(pod, now)
