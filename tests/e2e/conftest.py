"""End-to-end fixtures: any cluster reachable through the `kubeconfig` fixture
(the local cluster by default, kind or another cluster when KUBECONFIG is set).

The operator runs as a host process (`disttrain operator`) watching only the
namespaces these tests create (`e2e-op-<xdist worker>-*`: one operator per cluster lane), so
tests stay fast and never touch anything else on the cluster; the in-cluster install is
tested on its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.utils import parse_quantity
from ports import free_port  # tests/ports.py: each xdist worker's own slice

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crd" / "disttrainjobs.yaml"
DISTTRAIN = Path(sys.executable).parent / "disttrain"
NODE_LOST_AFTER_S = 15
# Jobs keep their checkpoints where a user's job does by default: on the claim the operator
# creates for each job (`<job>-checkpoints`), provisioned by the cluster's default
# StorageClass (the local cluster's: kube-controller-manager's hostPath provisioner, one folder
# of this machine that every node shares). A folder of this machine that tests give pods as a
# static hostPath PersistentVolume of their own (test_user_image.py's corpus).
HOST_FOLDER = "/var/lib/disttrain/checkpoints"


# The namespaces the session's operator watches: one set per pytest-xdist worker, since each
# cluster lane (tests/conftest.py) runs its own operator beside the other lane's.
OPERATOR_NAMESPACES = f"e2e-op-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


class Kubectl:
    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.env = {**os.environ, "KUBECONFIG": kubeconfig}
        # The reads that tests poll (a job, its pods) go through one kept-alive client: a kubectl
        # process costs ~70 ms of CPU, and polls every 0.3 s starve the trainers on 2 cores.
        self._api = kubernetes.config.new_client_from_config(config_file=kubeconfig)

    def read(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One typed client read, returned as the API server's JSON (what `kubectl get -o json`
        prints) rather than the client's models."""
        try:
            resp = call(*args, _preload_content=False, _request_timeout=30, **kwargs)
        except kubernetes.client.ApiException as e:
            raise AssertionError(f"{call.__name__}{args} failed ({e.status}): {e.body!r}") from e
        return json.loads(resp.read())

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["kubectl", *args], input=input, env=self.env, text=True,
                              capture_output=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", input=yaml.safe_dump(obj), check=check)

    def job(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.read(kubernetes.client.CustomObjectsApi(self._api).get_namespaced_custom_object,
                              "disttrain.dev", "v1alpha1", ns, "disttrainjobs", name))

    def pods(self, ns: str, job: str) -> list[dict[str, Any]]:
        return list(self.read(kubernetes.client.CoreV1Api(self._api).list_namespaced_pod, ns,
                              label_selector=f"disttrain.dev/job-name={job}")["items"])

    def wait_for(self, what: str, fn: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = fn()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")

    def wait_phase(self, ns: str, name: str, phases: tuple[str, ...], timeout: float) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = self.job(ns, name)
            return job if (job.get("status") or {}).get("phase") in phases else None

        try:
            return self.wait_for(f"{name} phase in {phases}", check, timeout, interval=0.5)  # a cheap read
        except AssertionError:
            print(self.run("describe", "disttrainjobs.disttrain.dev", name, "-n", ns, check=False).stdout)
            print(self.run("get", "pods", "-n", ns, "-o", "wide", check=False).stdout)
            raise


def _millicores(q: str) -> int:
    return int(parse_quantity(q) * 1000)


def wait_for_room(kubectl: Kubectl, cpu_millicores: int, timeout: float = 180) -> None:
    """Wait until every node is schedulable (Ready, no NoSchedule/NoExecute taint) and can take
    one more pod requesting `cpu_millicores`: the pods of earlier tests leave with their
    namespace asynchronously, and a node restarted by an earlier test keeps its
    `unreachable` taint until the node controller's next pass."""

    def room() -> dict[str, int] | None:
        nodes = kubectl.json("get", "nodes")["items"]
        pods = kubectl.json("get", "pods", "--all-namespaces")["items"]
        free: dict[str, int] = {}
        for n in nodes:
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            blocked = [t for t in n["spec"].get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
            if not ready or blocked or n["spec"].get("unschedulable"):
                return None
            free[n["metadata"]["name"]] = _millicores(n["status"]["allocatable"]["cpu"])
        for p in pods:
            node = p["spec"].get("nodeName")
            if node in free and p["status"].get("phase") not in ("Succeeded", "Failed"):
                for c in p["spec"]["containers"]:
                    free[node] -= _millicores(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        return free if all(v >= cpu_millicores for v in free.values()) else None

    kubectl.wait_for(f"every node schedulable with {cpu_millicores}m CPU free", room, timeout=timeout)


def condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Any) -> Kubectl:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not on PATH (make cluster-prereqs installs it)")
    return Kubectl(str(kubeconfig))


@pytest.fixture(scope="session")
def crd(kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(CRD))
    # Not `kubectl wait --for=condition=Established`: kubectl 1.32 fails at once ("accessor
    # error") on a CRD whose status has no conditions yet, as a just-created one has.
    kubectl.wait_for("the CRD to be Established", lambda: any(
        c.get("type") == "Established" and c.get("status") == "True" for c in
        (kubectl.read(kubernetes.client.ApiextensionsV1Api(kubectl._api).read_custom_resource_definition,
                      "disttrainjobs.disttrain.dev").get("status") or {}).get("conditions") or []),
        timeout=60, interval=0.5)
    _wait_for_gc_of_jobs(kubectl)


def _wait_for_gc_of_jobs(kubectl: Kubectl) -> None:
    """The garbage collector learns about a new resource type only at its next discovery
    sync (every 30 s in kube-controller-manager 1.20); until then a deleted job's children
    stay. Probe it once (a job no operator watches, one dependent ConfigMap) so the
    tests' own waits measure the operator, not that sync."""
    ns = f"e2e-gc-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    try:
        job = {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
               "metadata": {"name": "gc-probe", "namespace": ns}, "spec": {}}
        kubectl.apply(job)
        uid = kubectl.job(ns, "gc-probe")["metadata"]["uid"]
        kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "gc-probe-child", "namespace": ns,
            "ownerReferences": [{"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
                                 "name": "gc-probe", "uid": uid}]}})
        kubectl.run("delete", "disttrainjobs.disttrain.dev", "gc-probe", "-n", ns, "--wait=true")
        kubectl.wait_for("the garbage collector to delete a deleted job's child", lambda: kubectl.run(
            "get", "configmap", "gc-probe-child", "-n", ns, "--ignore-not-found", "-o", "name").stdout.strip() == "",
            timeout=90, interval=1.0)
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


class OperatorProcess:
    def __init__(self, kubectl: Kubectl, namespaces: list[str], log: Path, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.kubectl, self.namespaces, self.log, self.extra = kubectl, namespaces, log, extra
        self.settings = dict(env or {})  # DISTTRAIN_OPERATOR_* settings only env vars carry
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    def start(self) -> None:
        # The local cluster evicts a lost node's pods 5 s after it turns NotReady (controlplane.py),
        # not Kubernetes' 300 s: the operator is told about as much (15 s), so node-loss tests take
        # seconds. Progress is written every 2 s, not 10: tests that act at a step see it sooner.
        args = [str(DISTTRAIN), "operator", "--metrics-port", str(self.metrics_port), "--poll-interval", "2",
                "--progress-interval", "2",
                "--liveness", self.liveness_url, "--node-lost-after", str(NODE_LOST_AFTER_S)]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        args += list(self.extra)
        self.fh = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        # The local cluster and kind advertise nvidia.com/gpu without GPUs behind it: let GPU
        # jobs train on CPU there instead of failing with "no CUDA device" (exit 2).
        env = {**self.kubectl.env, "DISTTRAIN_OPERATOR_ALLOW_CPU_FALLBACK": "true", **self.settings}
        self.proc = subprocess.Popen(args, env=env, stdout=self.fh, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, like a crashed operator pod."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "fh", None):
            self.fh.close()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kubectl, [f"{OPERATOR_NAMESPACES}-*"], tmp_path_factory.mktemp("operator") / "operator.log")
    op.start()
    yield op
    op.stop()
    print("operator log tail:\n" + op.tail())


def _namespace(kubectl: Kubectl, prefix: str) -> Iterator[str]:
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", ns)
    yield ns
    # Jobs carry no finalizer: the namespace goes whether or not an operator still runs. Their
    # checkpoint claims go with it, and with them their volumes (reclaim policy Delete).
    kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace watched by the session's host operator."""
    yield from _namespace(kubectl, OPERATOR_NAMESPACES)


@pytest.fixture
def own_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace the session operator does NOT watch (for tests with their own operator)."""
    yield from _namespace(kubectl, "e2e-own")


def job_manifest(name: str, ns: str, *, steps: int = 20, sleep: int | None = None, **spec: Any) -> dict[str, Any]:
    """A small data-parallel digits job; `sleep` swaps the trainer for `sleep N` (no training)."""
    body: dict[str, Any] = {
        "mode": "data",
        "workers": {"replicas": 2, "resources": {"cpu": "500m", "memory": "768Mi"}},
        "model": {"name": "mlp", "hidden": 64, "layers": 2},
        "data": {"name": "digits", "batchSize": 64},
        "training": {"steps": steps, "logIntervalSteps": 5},
        "checkpoint": {"intervalSteps": 10, "keep": 2},
    }
    if sleep is not None:
        body["workers"]["template"] = {"containers": [{"name": "trainer", "command": ["sh", "-c", f"sleep {sleep}"]}]}
        # `sh` as PID 1 ignores SIGTERM (the trainer handles it): do not wait out the default 30 s.
        body["runPolicy"] = {"terminationGracePeriodSeconds": 1}
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    if "batchSize" not in (spec.get("data") or {}):  # divisible by the data-parallel degree
        body["data"]["batchSize"] = 32 * body["workers"]["replicas"]
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
            "metadata": {"name": name, "namespace": ns}, "spec": body}


def digits_manifest(name: str, ns: str, **over: Any) -> dict[str, Any]:
    """The data-parallel example as shipped (its checkpoints on the claim the operator makes),
    renamed, at 750m CPU per pod."""
    obj = yaml.safe_load((ROOT / "manifests" / "examples" / "data-parallel.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": ns}
    obj["spec"]["workers"]["resources"]["cpu"] = "750m"
    for key, value in over.items():
        obj["spec"][key] = {**obj["spec"].get(key, {}), **value}
    return obj


def events(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    """The job's Events, oldest first. Only those about the DistTrainJob itself: its headless
    Service and Endpoints share its name, and the endpoints controller's own Events about
    them (e.g. a retried FailedToUpdateEndpoint after a node stops) are not the operator's."""
    selector = f"involvedObject.name={name},involvedObject.kind=DistTrainJob"
    items = kubectl.json("get", "events", "-n", ns, "--field-selector", selector)["items"]
    return sorted(items, key=lambda e: (e.get("firstTimestamp") or e.get("eventTime") or "", e["metadata"]["name"]))


def wait_event(kubectl: Kubectl, ns: str, name: str, *reasons: str, timeout: float = 60.0) -> dict[str, Any]:
    """The job's first Event with one of `reasons`, waited for: the operator posts a decision's
    Events after its status write (and a restart's pod deletions), so a test that saw the status
    change may look a moment before they exist on a busy host."""
    return kubectl.wait_for(f"an Event {' or '.join(reasons)}", lambda: next(
        (e for e in events(kubectl, ns, name) if e["reason"] in reasons), None), timeout=timeout, interval=1.0)  # fmt: skip


def assert_no_repeated_events(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    """`kubectl describe` lists each of the operator's actions and failures once: no Event
    repeats (neither a second Event with the same reason and message, nor one Event with
    count > 1)."""
    found = events(kubectl, ns, name)
    keys = [(e["reason"], e["message"]) for e in found]
    repeated = sorted({k for k in keys if keys.count(k) > 1}
                      | {k for e, k in zip(found, keys, strict=True) if (e.get("count") or 1) > 1})
    assert not repeated, f"repeated Events for {ns}/{name}: {repeated}"
    return found


_VOLUME_FOLDERS: dict[tuple[str, str], Path] = {}


def volume_folder(kubectl: Kubectl, ns: str, claim: str) -> Path | None:
    """This machine's folder behind a bound claim, None while it is unbound: a hostPath volume of
    the local cluster's provisioner (every node is this machine), or on kind one of the host
    folder every node mounts at the same path (hack/kind.yaml)."""
    if (ns, claim) not in _VOLUME_FOLDERS:
        core = kubernetes.client.CoreV1Api(kubectl._api)
        try:
            pvc = core.read_namespaced_persistent_volume_claim(claim, ns)
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise
        if pvc.status.phase != "Bound" or not pvc.spec.volume_name:
            return None
        pv = core.read_persistent_volume(pvc.spec.volume_name)
        source = pv.spec.host_path or pv.spec.local  # kind's local-path provisioner may make `local` volumes
        assert source is not None, f"claim {ns}/{claim} is bound to {pv.metadata.name}, not a folder of a node"
        _VOLUME_FOLDERS[(ns, claim)] = Path(source.path)
    return _VOLUME_FOLDERS[(ns, claim)]


def checkpoint_dir(kubectl: Kubectl, ns: str, job: str) -> Path | None:
    """The job's checkpoint directory on this machine (`<volume>/<job>`, the volume being the
    claim the operator made for it); None until its claim is bound."""
    folder = volume_folder(kubectl, ns, f"{job}-checkpoints")
    return None if folder is None else folder / job


def checkpoint_steps(kubectl: Kubectl, ns: str, job: str) -> list[int]:
    """Steps of the job's complete checkpoints (read on this machine: every node shares the
    volume's folder)."""
    root = checkpoint_dir(kubectl, ns, job)
    if root is None or not root.is_dir():
        return []
    # step-N.corrupt (moved aside) and the dot-entries (.fence/, .tmp-*) are not checkpoints.
    return sorted(int(p.name[5:]) for p in root.iterdir() if re.fullmatch(r"step-\d+", p.name))


def job_claim(kubectl: Kubectl, ns: str, job: str) -> dict[str, Any]:
    """The checkpoint claim the operator made for the job, as the API server has it."""
    return dict(kubectl.read(kubernetes.client.CoreV1Api(kubectl._api).read_namespaced_persistent_volume_claim,
                             f"{job}-checkpoints", ns))
