"""A job's children through `Reconciler` against an in-memory API that answers like the API
server (201 / 409 AlreadyExists / 404 / a 4xx rejection with a Status message; UID
preconditions on deletes): names held by objects that are not the job's, children of an
earlier job with the same name, children the API server rejects, and deletes that only hit
what the job controls."""

from __future__ import annotations

import base64
import copy
import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from disttrain_api.model import PLURAL, parse_spec
from disttrain_operator.cache import JobCache
from disttrain_operator.creation import delete_servers
from disttrain_operator.kube import Conflict, Kube, KubeError
from disttrain_operator.observe import format_time, slim_pod
from disttrain_operator.reconcile import MAX_CREATE_RETRY_S, Reconciler
from disttrain_operator.scraper import ProgressScraper
from disttrain_operator.settings import OperatorSettings
from kubernetes import client

NS, NAME, UID = "ns", "redis", "job-uid"
KEY = (NS, NAME)
INTERVAL = 3.0


def owned_by(kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "x/v1", "kind": kind, "name": name, "uid": uid, "controller": True}]


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as the API server applies one."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Api(Kube):
    """Objects by (resource, name); every write recorded as (verb, resource, name, body)."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.job = job
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rejections: dict[tuple[str, str], tuple[int, str]] = {}
        self.writes: list[tuple[str, str, str, Any]] = []
        self.lock = threading.Lock()
        self.serial = 0

    def request(self, method: str, path: str, *, resource: str, verb: str, query: Any = None, body: Any = None,
                content_type: str = "application/json", allow: tuple[int, ...] = ()) -> tuple[int, dict[str, Any]]:
        with self.lock:
            status, answer = self._answer(path, resource, verb, body)
        if status >= 300 and status not in allow:
            raise (Conflict if status == 409 else KubeError)(status, method, path, json.dumps(answer))
        return status, answer

    def _answer(self, path: str, resource: str, verb: str, body: Any) -> tuple[int, dict[str, Any]]:
        if resource == PLURAL + "/status":
            self.job["status"] = merge(self.job.get("status") or {}, body["status"])
            self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
            return 200, copy.deepcopy(self.job)
        if resource in ("events", PLURAL):
            return 201, {}
        name = body["metadata"]["name"] if verb == "create" else path.rsplit("/", 1)[1]
        key = (resource, name)
        if verb != "get":
            self.writes.append((verb, resource, name, copy.deepcopy(body)))
        if verb == "create":
            if key in self.rejections:
                code, message = self.rejections[key]
                return code, {"kind": "Status", "reason": "Forbidden" if code == 403 else "Invalid",
                              "message": message}
            if key in self.objects:
                return 409, {"message": "already exists"}
            self.serial += 1
            obj = copy.deepcopy(body)
            obj["metadata"].update(uid=f"{resource}-{self.serial}", resourceVersion="1")
            self.objects[key] = obj
            return 201, copy.deepcopy(obj)
        live = self.objects.get(key)
        if live is None:
            return 404, {"message": "not found"}
        if verb == "get":
            return 200, copy.deepcopy(live)
        if verb == "update":
            if body["metadata"].get("resourceVersion") != live["metadata"]["resourceVersion"]:
                return 409, {"message": "the object has been modified"}
            self.objects[key] = {**copy.deepcopy(body), "metadata": {**body["metadata"], "uid": live["metadata"]["uid"]}}
            return 200, {}
        if verb == "delete":
            want = ((body or {}).get("preconditions") or {}).get("uid")
            if want is not None and want != live["metadata"]["uid"]:
                return 409, {"message": "Precondition failed: UID in precondition"}
            del self.objects[key]
            return 200, {}
        raise AssertionError(f"unexpected {verb} {path}")

    def pods(self, phase: str) -> list[dict[str, Any]]:
        out = []
        for (resource, _), obj in sorted(self.objects.items()):
            if resource == "pods":
                pod = copy.deepcopy(obj)
                pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
                pod["status"] = {"phase": phase}
                out.append(slim_pod(pod))
        return out

    def touched(self, resource: str, name: str) -> list[str]:
        return [verb for verb, r, n, _ in self.writes if (r, n) == (resource, name)]


def setup(**spec: Any) -> tuple[Api, JobCache, Reconciler, list[tuple[str, str, str]]]:
    job = {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
           "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1, "resourceVersion": "100"},
           "spec": {"mode": "data", "image": "img", "workers": {"replicas": 2}, "data": {"batchSize": 64}, **spec}}
    api = Api(job)
    jobs = JobCache()
    jobs.put(KEY, copy.deepcopy(job))
    events: list[tuple[str, str, str]] = []
    scraper = ProgressScraper(lambda ip, port: None, lambda key: None, interval_s=INTERVAL)
    rec = Reconciler(api, OperatorSettings(poll_interval_s=INTERVAL), jobs, scraper,
                     lambda job, type_, reason, message: events.append((type_, reason, message)))
    return api, jobs, rec, events


def condition(api: Api, type_: str) -> dict[str, Any] | None:
    return next((c for c in api.job["status"].get("conditions") or [] if c["type"] == type_), None)


def test_a_foreign_service_with_the_jobs_name_survives_and_the_job_waits_for_the_name() -> None:
    api, _, rec, events = setup()
    helm = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": NAME, "namespace": NS, "uid": "helm-svc", "resourceVersion": "7",
        "labels": {"app.kubernetes.io/managed-by": "Helm"}}, "spec": {"ports": [{"port": 6379}]}}
    api.objects[("services", NAME)] = copy.deepcopy(helm)
    first = rec(KEY, [])
    assert api.objects[("services", NAME)] == helm  # untouched: not deleted, not replaced
    assert api.touched("services", NAME) == ["create"]
    assert not [w for w in api.writes if w[1] == "pods"]  # no gang while a name is taken
    cond = condition(api, "NameConflict")
    assert cond is not None and cond["status"] == "True"
    assert f"Service {NS}/{NAME} exists, with no controller owner" in cond["message"]
    assert api.job["status"]["phase"] == "Pending" and "Created" not in str(api.job["status"]["conditions"])
    assert [(t, r) for t, r, _ in events] == [("Warning", "NameConflict")]
    assert f"Service {NS}/{NAME}" in events[0][2]
    # Retried with backoff, one Event for the whole wait.
    second = rec(KEY, [])
    assert first == INTERVAL and second == 2 * INTERVAL and len(events) == 1
    for _ in range(8):
        last = rec(KEY, [])
    assert last == MAX_CREATE_RETRY_S and api.objects[("services", NAME)] == helm
    # The user frees the name: the next try creates the gang.
    del api.objects[("services", NAME)]
    assert rec(KEY, []) is None
    assert condition(api, "NameConflict")["status"] == "False"  # type: ignore[index]
    assert condition(api, "Created")["status"] == "True"  # type: ignore[index]
    assert api.objects[("services", NAME)]["metadata"]["ownerReferences"][0]["uid"] == UID
    assert len([k for k in api.objects if k[0] == "pods"]) == 2
    assert [r for _, r, _ in events] == ["NameConflict", "GangCreated"]


def test_another_owners_object_is_a_conflict_naming_its_owner() -> None:
    api, _, rec, events = setup()
    api.objects[("configmaps", f"{NAME}-config")] = {"kind": "ConfigMap", "metadata": {
        "name": f"{NAME}-config", "uid": "cm", "resourceVersion": "1",
        "ownerReferences": owned_by("DistTrainJob", "another-job", "other-uid")}}
    rec(KEY, [])
    assert api.touched("configmaps", f"{NAME}-config") == ["create"]
    assert "controlled by DistTrainJob another-job" in condition(api, "NameConflict")["message"]  # type: ignore[index]


def test_an_earlier_jobs_children_are_left_to_the_garbage_collector() -> None:
    # A DistTrainJob with this name but another UID owned it: deleted, its children go with it.
    api, _, rec, events = setup()
    api.objects[("configmaps", f"{NAME}-config")] = {"kind": "ConfigMap", "metadata": {
        "name": f"{NAME}-config", "uid": "old-cm", "resourceVersion": "3",
        "ownerReferences": owned_by("DistTrainJob", NAME, "old-job-uid")}}
    again = rec(KEY, [])
    assert api.touched("configmaps", f"{NAME}-config") == ["create"]  # no delete, no replace
    assert again == INTERVAL and not [w for w in api.writes if w[1] == "pods"]
    assert "garbage collector" in api.job["status"]["message"] and condition(api, "NameConflict") is None
    assert not events
    del api.objects[("configmaps", f"{NAME}-config")]  # the garbage collector's turn
    rec(KEY, [])
    assert condition(api, "Created")["status"] == "True"  # type: ignore[index]


def test_the_jobs_own_config_map_is_replaced_at_the_version_read() -> None:
    api, _, rec, _ = setup()
    api.objects[("configmaps", f"{NAME}-config")] = {"kind": "ConfigMap", "metadata": {
        "name": f"{NAME}-config", "uid": "mine", "resourceVersion": "5", "ownerReferences": owned_by(
            "DistTrainJob", NAME, UID)}, "data": {}}
    rec(KEY, [])
    ((_, _, _, body),) = [w for w in api.writes if w[:3] == ("update", "configmaps", f"{NAME}-config")]
    assert body["metadata"]["resourceVersion"] == "5"
    assert condition(api, "Created")["status"] == "True"  # type: ignore[index]


def test_a_rejected_child_becomes_a_condition_and_fails_the_job_after_the_timeout() -> None:
    api, jobs, rec, events = setup(runPolicy={"childRejectedTimeoutSeconds": 120})
    quota = f'pods "{NAME}-worker-1" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1'
    api.rejections[("pods", f"{NAME}-worker-1")] = (403, quota)
    again = rec(KEY, [])  # answered with a condition, not raised as an error to retry in silence
    cond = condition(api, "ChildRejected")
    assert cond is not None and cond["status"] == "True" and quota in cond["message"]
    assert f"Pod {NS}/{NAME}-worker-1: HTTP 403 Forbidden" in cond["message"]
    assert "childRejectedTimeoutSeconds=120" in cond["message"]
    assert [(t, r) for t, r, _ in events] == [("Warning", "ChildRejected")] and quota in events[0][2]
    assert api.job["status"]["phase"] == "Pending" and again is not None and 0 < again <= 120
    rec(KEY, api.pods("Pending"))  # retried: still refused, no second Event
    assert len(events) == 1 and api.job["status"]["phase"] == "Pending"
    # The timeout passes (the condition's lastTransitionTime is the clock).
    cond = condition(api, "ChildRejected")
    assert cond is not None
    cond["lastTransitionTime"] = format_time(datetime.now(UTC) - timedelta(seconds=121))
    api.job["metadata"]["resourceVersion"] = str(int(api.job["metadata"]["resourceVersion"]) + 1)
    jobs.put(KEY, copy.deepcopy(api.job))
    rec(KEY, api.pods("Pending"))
    st = api.job["status"]
    assert st["phase"] == "Failed" and condition(api, "Failed")["reason"] == "ChildRejected"  # type: ignore[index]
    assert quota in st["message"] and "fix the spec" in st["message"]
    assert ("delete", "pods", f"{NAME}-worker-0") in [w[:3] for w in api.writes]  # the half gang goes
    assert [r for _, r, _ in events] == ["ChildRejected", "ChildRejected"]


def test_pod_deletes_name_the_pod_the_decision_saw() -> None:
    api, _, rec, _ = setup()
    rec(KEY, [])
    pods = api.pods("Running")
    rec(KEY, pods)
    failed = api.pods("Running")
    failed[1]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    rec(KEY, failed)
    deletes = {n: body for verb, r, n, body in api.writes if (verb, r) == ("delete", "pods")}
    assert set(deletes) == {f"{NAME}-worker-0", f"{NAME}-worker-1"}
    for pod in failed:
        assert deletes[pod["metadata"]["name"]]["preconditions"] == {"uid": pod["metadata"]["uid"]}


def test_server_deployments_are_deleted_one_by_one_only_when_the_job_controls_them() -> None:
    api, _, _, _ = setup()
    spec = parse_spec({"mode": "paramserver", "paramServer": {"shards": 3}})
    mine = owned_by("DistTrainJob", NAME, UID)
    api.objects[("deployments", f"{NAME}-server-0")] = {"metadata": {"name": f"{NAME}-server-0", "uid": "d0",
                                                                     "ownerReferences": mine}}
    api.objects[("deployments", f"{NAME}-server-1")] = {"metadata": {"name": f"{NAME}-server-1", "uid": "d1"}}
    delete_servers(api, spec, api.job)
    assert [w[:3] for w in api.writes] == [("delete", "deployments", f"{NAME}-server-0")]
    assert api.writes[0][3]["preconditions"] == {"uid": "d0"}
    assert ("deployments", f"{NAME}-server-1") in api.objects  # not ours: kept


# ------------------------------------------------------------------ what the operator may use


def edited(api: Api, jobs: JobCache) -> None:
    """The test changed api.job: a new resourceVersion, as the API server gives it, and into the cache."""
    api.job["metadata"]["resourceVersion"] = str(int(api.job["metadata"]["resourceVersion"]) + 1)
    jobs.put(KEY, copy.deepcopy(api.job))


def fed_setup(**spec: Any) -> tuple[Api, JobCache, Reconciler, list[tuple[str, str, str]]]:
    return setup(mode="federated", federated={"clients": 4, "clientsPerRound": 2}, **spec)


def secret_mounts(api: Api) -> set[str]:
    """Every Secret name a pod or pod template of the job mounts."""
    specs = [o["spec"] for (r, _), o in api.objects.items() if r == "pods"]
    specs += [o["spec"]["template"]["spec"] for (r, _), o in api.objects.items() if r == "deployments"]
    return {v["secret"]["secretName"] for s in specs for v in s["volumes"] if "secret" in v}


def settle(rec: Reconciler, api: Api, phase: str = "Pending", rounds: int = 4) -> None:
    for _ in range(rounds):
        rec(KEY, api.pods(phase))


def test_secrets_someone_created_under_the_names_the_operator_would_predict_are_never_mounted() -> None:
    # Anyone who may create Secrets in the namespace and read the job (its UID is public) can take
    # the names an older operator used, with a key of their own.
    api, _, rec, _ = fed_setup()
    planted = {f"{NAME}-identity-{UID.replace('-', '')[:8]}", f"{NAME}-tls-{UID.replace('-', '')[:8]}",
               f"{NAME}-identity", f"{NAME}-tls"}
    for name in planted:
        api.objects[("secrets", name)] = {"kind": "Secret", "metadata": {"name": name, "uid": "attacker"},
                                          "data": {"server.key": "a25vd24="}}
    first = rec(KEY, [])
    created = [n for verb, r, n, _ in api.writes if (verb, r) == ("create", "secrets")]
    # The first reconcile only mints (fresh random names) and records them; no pod yet.
    assert first == 0.0 and not [w for w in api.writes if w[1] in ("pods", "deployments")]
    recorded = api.job["status"]["secrets"]
    assert {recorded["identity"], recorded["tls"]} == set(created) and not set(created) & planted
    assert recorded["identity"].startswith(f"{NAME}-identity-") and len(recorded["identity"]) == len(NAME) + 20
    settle(rec, api)
    assert secret_mounts(api) == {recorded["identity"], recorded["tls"]}
    assert api.job["status"]["secrets"] == recorded  # minted once
    assert all(api.objects[("secrets", n)]["metadata"]["uid"] == "attacker" for n in planted)  # left alone


def test_a_fresh_secret_name_taken_meanwhile_is_not_the_jobs_and_another_is_minted() -> None:
    api, _, rec, _ = fed_setup()
    taken: list[str] = []
    answer = api._answer

    def squat(path: str, resource: str, verb: str, body: Any) -> tuple[int, dict[str, Any]]:
        # Someone creates the identity Secret's fresh name just before the operator does.
        if verb == "create" and resource == "secrets" and "-identity-" in body["metadata"]["name"] and not taken:
            taken.append(body["metadata"]["name"])
            api.objects[("secrets", taken[0])] = {"metadata": {"name": taken[0], "uid": "attacker"}}
        return answer(path, resource, verb, body)

    api._answer = squat  # type: ignore[method-assign]
    again = rec(KEY, [])
    assert again == INTERVAL and "identity" not in api.job["status"]["secrets"]  # tls recorded, identity not
    settle(rec, api)
    identity = api.job["status"]["secrets"]["identity"]
    assert identity != taken[0] and taken[0] not in secret_mounts(api) and identity in secret_mounts(api)


def test_the_gang_is_created_only_once_its_secrets_are_recorded() -> None:
    api, _, rec, _ = fed_setup()
    api.rejections[("secrets", "*")] = (403, "secrets is forbidden: exceeded quota")
    answer = api._answer

    def quota(path: str, resource: str, verb: str, body: Any) -> tuple[int, dict[str, Any]]:
        if verb == "create" and resource == "secrets":
            return 403, {"kind": "Status", "reason": "Forbidden", "message": "exceeded quota: secrets=0"}
        return answer(path, resource, verb, body)

    api._answer = quota  # type: ignore[method-assign]
    rec(KEY, [])
    assert "exceeded quota" in condition(api, "ChildRejected")["message"]  # type: ignore[index]
    assert not api.job["status"].get("secrets") and not [w for w in api.writes if w[1] != "secrets"]
    api._answer = answer  # type: ignore[method-assign]
    settle(rec, api)
    assert condition(api, "Created")["status"] == "True"  # type: ignore[index]
    assert secret_mounts(api) == set(job_secrets_recorded(api).values())


def job_secrets_recorded(api: Api) -> dict[str, str]:
    return {k: v for k, v in api.job["status"]["secrets"].items() if k in ("identity", "tls")}


def test_a_short_lived_certificate_is_renewed_and_the_gang_and_servers_move_to_it() -> None:
    api, jobs, rec, events = fed_setup()
    rec.settings = OperatorSettings(poll_interval_s=INTERVAL, tls_valid_s=120, tls_renew_before_s=60)
    settle(rec, api)
    first = dict(api.job["status"]["secrets"])
    cert = x509.load_pem_x509_certificate(base64.b64decode(api.objects[("secrets", first["tls"])]["data"]["tls.crt"]))
    assert abs((cert.not_valid_after_utc - datetime.now(UTC)).total_seconds() - 120) < 30  # the setting
    assert first["tlsNotAfter"] == format_time(cert.not_valid_after_utc)
    # Running: reconciled again by the clock once the renewal is due (about 60 s from now).
    api.job["status"]["phase"] = "Running"
    edited(api, jobs)
    again = rec(KEY, api.pods("Running"))
    assert again is not None and again <= 61, again
    # The renewal is due: the gang and its servers are recreated, not counted as a restart.
    due = api.job["status"]["secrets"]["tlsNotAfter"] = format_time(datetime.now(UTC) + timedelta(seconds=59))
    edited(api, jobs)
    rec(KEY, api.pods("Running"))
    st = api.job["status"]
    assert st["phase"] == "Restarting" and st["restarts"] == 0 and st["attempt"] == 1
    assert condition(api, "Restarting")["reason"] == "SecretsRenewed"  # type: ignore[index]
    assert ("Normal", "SecretsRenewed") in [(t, r) for t, r, _ in events]
    assert ("delete", "deployments", f"{NAME}-aggregator") in [w[:3] for w in api.writes]
    for pod in [k for k in api.objects if k[0] == "pods"]:  # the kubelet's part
        del api.objects[pod]
    settle(rec, api)
    second = api.job["status"]["secrets"]
    assert second["identity"] == first["identity"] and second["tls"] != first["tls"]
    assert second["tlsNotAfter"] > due
    assert secret_mounts(api) == {second["identity"], second["tls"]}  # every pod and the new aggregator


def test_a_suspended_job_with_an_expiring_certificate_is_not_polled() -> None:
    # Renewed when it resumes (the gang is recreated then anyway), not reconciled every second meanwhile.
    api, jobs, rec, _ = fed_setup(runPolicy={"suspend": True})
    api.job["status"] = {"phase": "Suspended", "observedGeneration": 1, "lastSpecReplicas": 2, "conditions": [],
                         "secrets": {"identity": "i", "tls": "t", "tlsNotAfter": format_time(datetime.now(UTC))}}
    edited(api, jobs)
    assert rec(KEY, []) is None


def test_a_config_map_with_the_jobs_config_name_that_is_not_the_jobs_is_never_read() -> None:
    # Anyone may create `<job>-config`: with the job's generation changed, the operator reads the
    # spec the gang runs from it; one another owner holds must not decide the immutable fields.
    api, jobs, rec, _ = setup()
    rec(KEY, [])
    rec(KEY, api.pods("Running"))
    forged = {"mode": "tensor", "workers": {"replicas": 2}, "parallelism": {"tensor": 2}}
    api.objects[("configmaps", f"{NAME}-config")] = {"kind": "ConfigMap", "metadata": {
        "name": f"{NAME}-config", "uid": "forged", "resourceVersion": "9",
        "ownerReferences": owned_by("DistTrainJob", "someone", "someone-uid")},
        "data": {"config.json": json.dumps(forged)}}
    api.job["metadata"]["generation"] = 2
    edited(api, jobs)
    rec(KEY, api.pods("Running"))
    assert condition(api, "InvalidSpec") is None, api.job["status"]  # not compared with the forged spec
    assert api.job["status"]["observedGeneration"] == 2


def test_the_ttl_delete_of_the_job_carries_its_uid() -> None:
    api, jobs, rec, _ = setup(runPolicy={"ttlSecondsAfterFinished": 0})
    api.job["status"] = {"phase": "Succeeded", "completionTime": format_time(datetime.now(UTC) - timedelta(seconds=5)),
                         "conditions": [], "observedGeneration": 1}
    deletes: list[Any] = []
    answer = api._answer

    def record(path: str, resource: str, verb: str, body: Any) -> tuple[int, dict[str, Any]]:
        if resource == PLURAL and verb == "delete":
            deletes.append(body)
        return answer(path, resource, verb, body)

    api._answer = record  # type: ignore[method-assign]
    edited(api, jobs)
    rec(KEY, [])
    assert deletes == [{"propagationPolicy": "Background", "preconditions": {"uid": UID}}]


def test_a_pod_that_copies_the_jobs_labels_is_never_scraped_for_its_progress() -> None:
    api, jobs, rec, _ = setup()
    rec(KEY, [])
    pods = api.pods("Running")
    for pod in pods:
        pod["status"]["podIP"] = f"10.0.0.{pod['metadata']['labels']['disttrain.dev/replica-index']}"
    copy_ = copy.deepcopy(pods[0])
    copy_["metadata"].update(name="impostor", uid="impostor-uid", ownerReferences=[])
    copy_["status"]["podIP"] = "10.9.9.9"
    api.job["status"]["phase"] = "Running"
    edited(api, jobs)
    rec(KEY, [copy_, *pods])
    assert rec.scraper._targets[KEY].ip == "10.0.0.0"  # the job's own rank 0
CLAIM = f"{NAME}-checkpoints"


def unschedulable(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for p in pods:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "message": "0/2 nodes are available: 2 pod has unbound immediate "
                                                 "PersistentVolumeClaims."}]
    return pods


def test_the_checkpoint_claim_is_created_with_the_gang_and_read_only_until_bound() -> None:
    api, jobs, rec, events = setup()
    reads: list[str] = []
    get = api.get
    api.get = lambda obj: (reads.append(obj["kind"]), get(obj))[1]  # type: ignore[method-assign]
    rec(KEY, [])
    claim = api.objects[("persistentvolumeclaims", CLAIM)]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == UID  # the garbage collector deletes it with the job
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and "storageClassName" not in claim["spec"]
    assert len([k for k in api.objects if k[0] == "pods"]) == 2
    # The gang waits for the claim: nothing is called Unschedulable (the phase message says so, written with
    # the next transition: a starting gang's message alone is not worth a write).
    unbound = unschedulable(api.pods("Pending"))
    jobs.put(KEY, copy.deepcopy(api.job))
    again = rec(KEY, unbound)
    assert reads.count("PersistentVolumeClaim") == 1 and again == INTERVAL  # read again after the poll interval
    assert condition(api, "Running") is None and [r for _, r, _ in events] == ["GangCreated"]
    # Bound: read once more, then never again.
    claim["status"] = {"phase": "Bound"}
    rec(KEY, unbound)
    rec(KEY, unbound)  # a pod event from before the binding: the claim is known bound
    rec(KEY, api.pods("Running"))
    assert reads.count("PersistentVolumeClaim") == 2 and api.job["status"]["phase"] == "Running"
    assert api.touched("persistentvolumeclaims", CLAIM) == ["create"]


def test_a_claim_pending_too_long_is_a_warning_and_the_storage_class_is_the_operators() -> None:
    api, jobs, _, events = setup()
    rec = Reconciler(api, OperatorSettings(poll_interval_s=INTERVAL, checkpoint_storage_class="rwo-only",
                                           claim_pending_after_s=60.0), jobs,
                     ProgressScraper(lambda ip, port: None, lambda key: None, interval_s=INTERVAL),
                     lambda job, type_, reason, message: events.append((type_, reason, message)))
    rec(KEY, [])
    claim = api.objects[("persistentvolumeclaims", CLAIM)]
    assert claim["spec"]["storageClassName"] == "rwo-only"
    claim["metadata"]["creationTimestamp"] = format_time(datetime.now(UTC) - timedelta(seconds=61))
    jobs.put(KEY, copy.deepcopy(api.job))
    rec(KEY, unschedulable(api.pods("Pending")))
    cond = condition(api, "CheckpointClaimPending")
    assert cond is not None and cond["status"] == "True" and "StorageClass rwo-only" in cond["message"]
    assert [(t, r) for t, r, _ in events] == [("Normal", "GangCreated"), ("Warning", "ClaimPending")]


def test_a_claim_kept_by_an_earlier_job_of_this_name_is_reused_and_one_of_another_is_a_conflict() -> None:
    api, _, rec, events = setup(checkpoint={"retain": True})
    kept = {"kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "uid": "kept", "resourceVersion": "9",
                                                          "labels": {"disttrain.dev/job-name": NAME}},
            "status": {"phase": "Bound"}}
    api.objects[("persistentvolumeclaims", CLAIM)] = copy.deepcopy(kept)
    rec(KEY, [])
    assert api.objects[("persistentvolumeclaims", CLAIM)] == kept  # mounted as it is: never adopted, never replaced
    assert condition(api, "Created")["status"] == "True" and condition(api, "NameConflict") is None  # type: ignore[index]
    assert len([k for k in api.objects if k[0] == "pods"]) == 2
    # Someone's claim that happens to have the name: the operator leaves it and waits.
    api, _, rec, events = setup()
    api.objects[("persistentvolumeclaims", CLAIM)] = {"kind": "PersistentVolumeClaim", "metadata": {
        "name": CLAIM, "uid": "theirs", "resourceVersion": "1"}}
    rec(KEY, [])
    assert "PersistentVolumeClaim ns/redis-checkpoints exists, with no controller owner" in condition(
        api, "NameConflict")["message"]  # type: ignore[index]
    assert not [k for k in api.objects if k[0] == "pods"]
