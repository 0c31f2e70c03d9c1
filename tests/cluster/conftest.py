"""Helpers for the cluster tier: a `kube` helper on the local cluster and a namespace per test.

(Helpers are fixtures, not importable functions: tests run with --import-mode=importlib.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

TEST_IMAGE = "disttrain-test:dev"
TRAINER_IMAGE = "disttrain-trainer:dev"


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.test_image, self.trainer_image = TEST_IMAGE, TRAINER_IMAGE

    @staticmethod
    def wait(probe: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = probe()
            if got:
                return got
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")

    def exists(self, read: Callable[[], Any]) -> bool:
        try:
            read()
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    @staticmethod
    def pod(name: str, *, command: list[str], image: str = TEST_IMAGE, node: str | None = None,
            labels: dict[str, str] | None = None, container: dict[str, Any] | None = None,
            **spec: Any) -> client.V1Pod:
        spec.setdefault("restart_policy", "Never")
        # Burstable, not best-effort: a best-effort container (cpu.shares 2) starves beside the
        # other lane's busy pods on a loaded machine.
        container = {"resources": client.V1ResourceRequirements(requests={"cpu": "50m"}), **(container or {})}
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
            spec=client.V1PodSpec(
                node_selector={"kubernetes.io/hostname": node} if node else None,
                termination_grace_period_seconds=1,
                containers=[client.V1Container(name="main", image=image, image_pull_policy="Never",
                                               command=command, **container)],
                **spec,
            ),
        )

    @staticmethod
    def pod_state(pod: client.V1Pod) -> str:
        """What a pod is doing, in a word: its first container's state, else whether it is scheduled."""
        for s in pod.status.container_statuses or []:
            if s.state.running:
                return "Running"
            if s.state.terminated:
                return "Terminated"
            if s.state.waiting:
                return s.state.waiting.reason or "Waiting"
        return "Scheduled" if pod.spec.node_name else "Unscheduled"

    def pods_report(self, ns: str, limit: int = 20) -> str:
        """A line per pod of `ns` (the first `limit`), for a failure that waited for them to go."""
        lines = [f"{p.metadata.name} uid={p.metadata.uid} node={p.spec.node_name} phase={p.status.phase} "
                 f"ip={p.status.pod_ip} deleted={p.metadata.deletion_timestamp} state={self.pod_state(p)}"
                 for p in self.core.list_namespaced_pod(ns).items]
        return "\n".join(lines[:limit]) + (f"\n... {len(lines) - limit} more" if len(lines) > limit else "")

    def logs(self, ns: str, name: str) -> str:
        try:
            return str(self.core.read_namespaced_pod_log(name, ns))
        except ApiException as e:
            return f"<no logs: {e.reason}>"

    def wait_phase(self, ns: str, name: str, phases: tuple[str, ...], timeout: float = 90) -> client.V1Pod:
        def probe() -> client.V1Pod | None:
            p = self.core.read_namespaced_pod(name, ns)
            if p.status.phase in phases:
                return p
            if p.status.phase == "Failed":
                raise AssertionError(f"pod {ns}/{name} failed: {p.status.container_statuses}\n"
                                     f"logs:\n{self.logs(ns, name)}")
            return None

        return self.wait(probe, timeout=timeout, what=f"pod {ns}/{name} to reach {phases}")


@pytest.fixture(scope="session")
def kube(local_cluster: Any) -> Kube:
    return Kube(config.new_client_from_config(config_file=str(local_cluster.kubeconfig)))


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = f"ct-{uuid.uuid4().hex[:8]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The ServiceAccount admission plugin rejects pods until the namespace's default SA exists
    # and has its token secret.
    def sa_ready() -> bool:
        try:
            return bool(kube.core.read_namespaced_service_account("default", name).secrets)
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    kube.wait(sa_ready, timeout=30, what=f"default ServiceAccount token in {name}")
    yield name
    kube.core.delete_namespace(name, propagation_policy="Background")
