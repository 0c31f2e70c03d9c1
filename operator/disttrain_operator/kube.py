"""A thin, counted REST layer for the objects a job owns.

It reuses the official client's configuration (kubeconfig or in-cluster service
account: host, TLS, client certificates, token refresh) and its connection pool,
but sends and receives plain JSON dicts — the builders' format — instead of the
generated models. Every call increments
`disttrain_operator_api_requests_total{verb,resource}` so the scale benchmark can
report API requests per job from the operator's own metrics.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from disttrain_api.model import GROUP, PLURAL, VERSION
from kubernetes import client, config

from . import opmetrics

TIMEOUT_S = 30.0
# Requests one reconcile sends at once (a gang's children); the pool is shared by all jobs.
FANOUT = 16
EVENT_SOURCE = "disttrain-operator"
# Every write, at DEBUG (`disttrain operator -v`), as it is sent: which replica wrote when.
log = logging.getLogger("disttrain.operator.api")


def load_config() -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


class KubeError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        # The API server's own words (a Status object): what a user reads in a condition.
        self.message = str(answer.get("message") or body)
        self.reason = str(answer.get("reason") or "")
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")


class Conflict(KubeError):
    """HTTP 409 on a write carrying a resourceVersion: the object changed since it was read."""


_PATHS = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
}


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        if api_client is None:
            cfg = client.Configuration.get_default_copy()
            # One connection per reconcile thread and per fan-out thread, not the default 10.
            cfg.connection_pool_maxsize = 48
            api_client = client.ApiClient(cfg)
        self.api = api_client
        self.cfg = self.api.configuration
        self.pool = self.api.rest_client.pool_manager
        self._fanout = ThreadPoolExecutor(max_workers=FANOUT, thread_name_prefix="kube-fanout")

    def each(self, fn: Callable[[dict[str, Any]], Any], objs: Iterable[dict[str, Any]]) -> list[Any]:
        """fn(obj) for every obj at once (one round trip for a whole gang, not one per pod);
        results in order; the first error is raised after all calls finished."""
        futures = [self._fanout.submit(fn, obj) for obj in objs]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]

    def request(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        verb: str,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        allow: tuple[int, ...] = (),
        timeout_s: float | None = None,
        retries: bool = True,
    ) -> tuple[int, dict[str, Any]]:
        """`timeout_s`: connecting and waiting for the reply share this budget (urllib3's total
        timeout) instead of TIMEOUT_S each; a server trickling bytes can still stretch a read,
        so the lease's watchdog never relies on it. `retries=False` sends the request once
        (urllib3 otherwise resends one that timed out or lost its connection, 3 more times)."""
        opmetrics.API_REQUESTS.labels(verb=verb, resource=resource).inc()
        if self.cfg.refresh_api_key_hook is not None:
            self.cfg.refresh_api_key_hook(self.cfg)  # rotates the in-cluster token
        headers = {"Accept": "application/json", "Content-Type": content_type}
        for auth in self.cfg.auth_settings().values():
            headers[auth["key"]] = auth["value"]
        url = self.cfg.host + path + (f"?{urlencode(query)}" if query else "")
        timeout = TIMEOUT_S if timeout_s is None else urllib3.Timeout(total=timeout_s)
        if method != "GET":
            log.debug("api write %s %s", method, path)
        resp = self.pool.request(
            method, url, headers=headers, body=None if body is None else json.dumps(body), timeout=timeout,
            **({} if retries else {"retries": False}),
        )
        text = resp.data.decode("utf-8", "replace") if resp.data else ""
        if resp.status >= 300 and resp.status not in allow:
            raise (Conflict if resp.status == 409 else KubeError)(resp.status, method, path, text)
        return resp.status, (json.loads(text) if text.startswith("{") else {})

    # ------------------------------------------------------------------ the job
    @staticmethod
    def _job_path(namespace: str, name: str = "") -> str:
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}"
        return f"{base}/{quote(name)}" if name else base

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = self.request("GET", self._job_path(namespace, name), resource=PLURAL, verb="get", allow=(404,))
        return None if status == 404 else body

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str) -> dict[str, Any]:
        """A JSON merge patch of status fields, conditional on the job's resourceVersion: a job
        changed by anyone since `resource_version` answers 409 (Conflict) instead of having a
        status computed from an older state written over it. Returns the patched job."""
        _, body = self.request(
            "PATCH", self._job_path(namespace, name) + "/status", resource=PLURAL + "/status", verb="patch",
            body={"metadata": {"resourceVersion": resource_version}, "status": status},
            content_type="application/merge-patch+json",
        )
        return body

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the job `name` only if it is still the one with `uid` (409 otherwise: a job
        created anew under the name since, by anyone, is never hit)."""
        self.request("DELETE", self._job_path(namespace, name), resource=PLURAL, verb="delete",
                     body={"propagationPolicy": "Background", "preconditions": {"uid": uid}}, allow=(404, 409))

    def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """One core/v1 Event on the job (what `kubectl describe` lists). Posted once, never
        retried: an Event that may or may not have been created is better lost than doubled."""
        meta = job["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": job.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": job.get("kind"),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1000],
            "source": {"component": EVENT_SOURCE}, "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self.request("POST", f"/api/v1/namespaces/{quote(meta['namespace'])}/events", resource="events",
                     verb="create", body=body)

    # ----------------------------------------------------------------- children
    # Every write below touches one named object; deletes carry the UID the caller checked
    # (a precondition), so a same-named object created meanwhile by anyone is never hit.
    def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create; the created object, or None when one with its name already exists (409)."""
        prefix, plural = _PATHS[obj["kind"]]
        path = f"{prefix}/namespaces/{quote(obj['metadata']['namespace'])}/{plural}"
        status, body = self.request("POST", path, resource=plural, verb="create", body=obj, allow=(409,))
        return None if status == 409 else body

    @staticmethod
    def _object_path(obj: dict[str, Any]) -> tuple[str, str]:
        prefix, plural = _PATHS[obj["kind"]]
        meta = obj["metadata"]
        return f"{prefix}/namespaces/{quote(meta['namespace'])}/{plural}/{quote(meta['name'])}", plural

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The live object with obj's kind, namespace and name; None when there is none."""
        path, plural = self._object_path(obj)
        status, body = self.request("GET", path, resource=plural, verb="get", allow=(404,))
        return None if status == 404 else body

    def replace(self, obj: dict[str, Any], resource_version: str) -> bool:
        """Replace the object as read at `resource_version`; False when it changed since (409)."""
        path, plural = self._object_path(obj)
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": resource_version}}
        status, _ = self.request("PUT", path, resource=plural, verb="update", body=body, allow=(409,))
        return status != 409

    def delete_exact(self, obj: dict[str, Any], uid: str) -> None:
        """Delete this very object (a UID precondition: never a same-named successor)."""
        path, plural = self._object_path(obj)
        self.request("DELETE", path, resource=plural, verb="delete", allow=(404, 409),
                     body={"preconditions": {"uid": uid}, "propagationPolicy": "Background"})

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}",
                                    resource="configmaps", verb="get", allow=(404,))
        return None if status == 404 else body

    def delete_pod(self, namespace: str, name: str, uid: str, *, force: bool = False) -> None:
        """Delete the pod `name` only if it is still the one with `uid` (409 otherwise: ignored);
        never by name alone. grace 0 removes the object at once: only for pods whose node cannot
        confirm."""
        if not uid:
            raise ValueError(f"pod {namespace}/{name}: refusing a delete without the UID it must have")
        body: dict[str, Any] = {"preconditions": {"uid": uid}}
        if force:
            body["gracePeriodSeconds"] = 0
        self.request("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", resource="pods",
                     verb="delete", body=body, allow=(404, 409))
