"""`kubectl apply -k manifests/` installs CRD, RBAC and the operator Deployment; the
in-cluster operator (own ServiceAccount, least-privilege RBAC) runs the
data-parallel digits example to Succeeded with test accuracy >= 0.95.

Marked whole_cluster (it runs while no other cluster test does): while it is installed,
the in-cluster operator watches every namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from .conftest import (  # type: ignore[import-not-found]
    ROOT,
    Kubectl,
    assert_no_repeated_events,
    digits_manifest,
    job_claim,
)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def installed(kubectl: Kubectl) -> Iterator[None]:
    kubectl.run("apply", "-k", str(ROOT / "manifests"), timeout=180)
    try:
        kubectl.run("rollout", "status", "deployment/disttrain-operator", "-n", "disttrain-system",
                    "--timeout=240s", timeout=260)
        yield
    finally:
        for part in ("operator/deployment.yaml", "rbac/application.yaml", "rbac/framework.yaml",
                     "rbac/service-account.yaml", "operator/namespace.yaml"):
            kubectl.run("delete", "--ignore-not-found", "-f", str(ROOT / "manifests" / part), check=False)


@pytest.mark.whole_cluster  # the in-cluster operator watches every namespace
def test_apply_k_installs_operator_that_runs_the_digits_job(kubectl: Kubectl, installed: None) -> None:
    crd = kubectl.json("get", "crd", "disttrainjobs.disttrain.dev")
    assert crd["spec"]["names"]["shortNames"] == ["dtj"]
    (pod,) = kubectl.json("get", "pods", "-n", "disttrain-system", "-l",
                          "app.kubernetes.io/name=disttrain-operator")["items"]
    assert pod["spec"]["serviceAccountName"] == "disttrain-operator"
    assert pod["spec"]["containers"][0]["image"] == "disttrain-operator:dev"
    ns = f"e2e-ic-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    name = f"digits-{uuid.uuid4().hex[:5]}"
    try:
        kubectl.apply(digits_manifest(name, ns))
        job = kubectl.wait_phase(ns, name, ("Succeeded", "Failed"), timeout=600)
        status = job["status"]
        assert status["phase"] == "Succeeded", status
        assert status["result"]["testAccuracy"] >= 0.95, status["result"]
        assert status["observedGeneration"] == job["metadata"]["generation"]
        assert status["replicas"] == 2 and status["restarts"] == 0
        # Its checkpoint claim, made by the in-cluster operator with the RBAC it is installed with.
        claim = job_claim(kubectl, ns, name)
        assert claim["status"]["phase"] == "Bound" and claim["metadata"]["ownerReferences"][0]["name"] == name
        table = kubectl.run("get", "dtj", name, "-n", ns).stdout
        assert "Succeeded" in table and "data" in table, table
        reasons = [e["reason"] for e in assert_no_repeated_events(kubectl, ns, name)]
        # A healthy job's one Event: the operator created its gang (Running and Succeeded are
        # conditions, not Events).
        assert reasons == ["GangCreated"], reasons
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=true", check=False, timeout=180)
