"""The operator's RBAC as installed: the chart rendered by helm (default values, a namespaced
install, a standby replica) and manifests/rbac. Least privilege, checked rule by rule: no
wildcard anywhere, no Secret verb but create (the operator reads no Secret), Leases only
through a Role in the operator's own namespace, no delete-by-label, and nothing the code does
not use."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "disttrain"
RELEASE_NS = "disttrain-system"
ROLE_KINDS = ("ClusterRole", "Role")
# Every (apiGroup, resource) the operator may touch and the verbs it may use there: what the
# code calls (kopf's watches and patches, kube.py, leader.py). Networking for the
# NetworkPolicies the operator renders is granted create only, like Secrets.
ALLOWED: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    ("disttrain.dev", "disttrainjobs"): {"get", "list", "watch", "patch", "delete"},
    ("disttrain.dev", "disttrainjobs/status"): {"patch"},
    ("disttrain.dev", "disttrainjobs/finalizers"): {"update"},
    ("", "pods"): {"list", "watch", "get", "create", "delete"},
    ("", "services"): {"get", "create"},
    ("", "configmaps"): {"get", "create", "update"},
    ("", "persistentvolumeclaims"): {"get", "create"},
    ("", "secrets"): {"create"},
    ("apps", "deployments"): {"get", "create", "delete"},
    ("", "events"): {"create"},
    ("networking.k8s.io", "networkpolicies"): {"create"},
    ("coordination.k8s.io", "leases"): {"get", "create", "update"},
}


@pytest.fixture(scope="module")
def helm() -> str:
    proc = subprocess.run([str(ROOT / "hack" / "install-helm.sh")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"hack/install-helm.sh failed: {proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


def rendered(helm: str, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run([helm, "template", "disttrain", str(CHART), "--namespace", RELEASE_NS, *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] in ROLE_KINDS]


def manifests() -> list[dict[str, Any]]:
    docs = [d for f in sorted((ROOT / "manifests" / "rbac").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]
    return [d for d in docs if d["kind"] in ROLE_KINDS]


def problems(roles: list[dict[str, Any]], operator_ns: str) -> list[str]:
    found: list[str] = []
    for role in roles:
        where = f"{role['kind']} {role['metadata'].get('namespace', '')}/{role['metadata']['name']}"
        for rule in role.get("rules") or []:
            values = [*rule.get("apiGroups", []), *rule.get("resources", []), *rule.get("verbs", []),
                      *rule.get("resourceNames", [])]
            if any("*" in v for v in values) or rule.get("nonResourceURLs"):
                found.append(f"{where}: wildcard or non-resource rule {rule}")
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    allowed = ALLOWED.get((group, resource))
                    if allowed is None:
                        found.append(f"{where}: {group}/{resource} is not something the operator touches")
                        continue
                    extra = set(rule.get("verbs", [])) - allowed
                    if extra:
                        found.append(f"{where}: {group}/{resource} grants {sorted(extra)} (allowed {sorted(allowed)})")
                    if resource == "secrets" and set(rule["verbs"]) != {"create"}:
                        found.append(f"{where}: Secrets with {rule['verbs']}: only create")
                    if resource == "leases" and (role["kind"] != "Role"
                                                 or role["metadata"].get("namespace") != operator_ns):
                        found.append(f"{where}: Leases outside a Role in the operator's namespace {operator_ns}")
                    if resource == "leases" and set(rule["verbs"]) - {"create"} and not rule.get("resourceNames"):
                        found.append(f"{where}: Lease get/update not limited to the operator's Lease")
    return found


@pytest.mark.parametrize("values", [
    [],
    ["--set", "operator.watchNamespaces={ml,research}"],
    ["--set", "operator.replicas=2", "--set", "operator.watchNamespaces={ml}"],
], ids=["cluster-wide", "namespaced", "standby"])
def test_the_charts_rbac_is_least_privilege(helm: str, values: list[str]) -> None:
    roles = rendered(helm, *values)
    assert roles and problems(roles, RELEASE_NS) == []


def test_the_manifests_rbac_is_least_privilege() -> None:
    roles = manifests()
    assert {r["kind"] for r in roles} == {"ClusterRole", "Role"}
    assert problems(roles, RELEASE_NS) == []


def test_the_checks_catch_what_they_are_for() -> None:
    # The checks themselves, on the rules of the operator as it used to be installed.
    bad = [{"kind": "ClusterRole", "metadata": {"name": "old"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "delete", "deletecollection"]},
        {"apiGroups": [""], "resources": ["*"], "verbs": ["get"]},
    ]}]
    found = "\n".join(problems(bad, RELEASE_NS))
    assert "Secrets with" in found and "Leases outside a Role" in found and "deletecollection" in found
    assert "wildcard" in found
