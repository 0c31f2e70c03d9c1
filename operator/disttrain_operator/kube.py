"""A thin, counted wrapper over the official kubernetes client for the objects a job
owns. Every call increments `disttrain_operator_api_requests_total{verb,resource}` so
the scale benchmark can report API requests per job from the operator's own metrics.
Objects go in and come out as plain dicts (the builders' format)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from . import opmetrics
from .api import GROUP, PLURAL, VERSION


def load_config() -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def _body(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data or b"{}")


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    @staticmethod
    def _count(verb: str, resource: str) -> None:
        opmetrics.API_REQUESTS.labels(verb=verb, resource=resource).inc()

    # ------------------------------------------------------------------ the job
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._count("get", PLURAL)
        try:
            return _body(self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self._count("patch", PLURAL + "/status")
        return _body(self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _preload_content=False))

    def delete_job(self, namespace: str, name: str) -> None:
        self._count("delete", PLURAL)
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    # ----------------------------------------------------------------- children
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self._count("list", "pods")
        return list(_body(self.core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False)).get("items") or [])

    def create(self, obj: dict[str, Any]) -> bool:
        """Create; False when it already exists (idempotent re-creation after a crash)."""
        kind, ns = obj["kind"], obj["metadata"]["namespace"]
        self._count("create", kind.lower() + "s")
        fn = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "Deployment": self.apps.create_namespaced_deployment,
        }[kind]
        try:
            fn(ns, obj, _preload_content=False)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def replace_config_map(self, obj: dict[str, Any]) -> None:
        if self.create(obj):
            return
        self._count("replace", "configmaps")
        self.core.replace_namespaced_config_map(
            obj["metadata"]["name"], obj["metadata"]["namespace"], obj, _preload_content=False)

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._count("get", "configmaps")
        try:
            return _body(self.core.read_namespaced_config_map(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete_pod(self, namespace: str, name: str, *, force: bool = False) -> None:
        self._count("delete", "pods")
        # grace 0 removes the object at once: only for pods whose node cannot confirm.
        grace = 0 if force else None
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_deployments(self, namespace: str, selector: str) -> None:
        self._count("deletecollection", "deployments")
        self.apps.delete_collection_namespaced_deployment(
            namespace, label_selector=selector, propagation_policy="Background", _preload_content=False)
