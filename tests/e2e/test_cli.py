"""The job's life through the `disttrain` command against a real API server and operator: submit
(the kubeconfig context's namespace), status while it runs and when done (-w until it succeeds),
logs of rank 0 (followed from before the pod exists, and read after), an RBAC refusal and a
missing job as one line each, delete --wait; and logs -f following a rank across a gang restart.

Cheap on purpose: one small training job (two 500m pods, about 20 s of steps), and one job whose
trainer is `sleep` (it restarts in seconds). The federated aggregator's log is read in
test_federated.py, from the job that test runs anyway.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import DISTTRAIN, Kubectl, OperatorProcess, job_manifest  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e


def cli(kubeconfig: Path | str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DISTTRAIN), *args], env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def background(kubeconfig: Path | str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(out, "wb") as fh, open(out.with_suffix(".err"), "wb") as err:
        return subprocess.Popen([str(DISTTRAIN), *args], env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                                stdout=fh, stderr=err)  # fmt: skip


def with_context_namespace(kubeconfig: str, ns: str, path: Path) -> Path:
    """A copy of the kubeconfig whose current context's namespace is `ns` (as `kubectl config
    set-context --current --namespace` makes it)."""
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    for ctx in cfg["contexts"]:
        if ctx["name"] == cfg["current-context"]:
            ctx["context"]["namespace"] = ns
    path.write_text(yaml.safe_dump(cfg))
    return path


def as_service_account(kubectl: Kubectl, ns: str, path: Path) -> Path:
    """A kubeconfig of a fresh service account in `ns` that no Role grants anything."""
    kubectl.run("create", "serviceaccount", "nobody", "-n", ns)
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                   "metadata": {"name": "nobody-token", "namespace": ns,
                                "annotations": {"kubernetes.io/service-account.name": "nobody"}}})  # fmt: skip
    token = kubectl.wait_for("the service account's token", lambda: kubectl.run(
        "get", "secret", "nobody-token", "-n", ns, "-o", "jsonpath={.data.token}").stdout, timeout=60, interval=0.5)
    cfg = yaml.safe_load(Path(kubectl.kubeconfig).read_text())
    ctx = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    cfg["users"] = [{"name": "nobody", "user": {"token": base64.b64decode(token).decode()}}]
    ctx["context"]["user"] = "nobody"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_jobs_life_through_the_cli(kubectl: Kubectl, operator: OperatorProcess, namespace: str,
                                     tmp_path: Path) -> None:  # fmt: skip
    name = f"cli-{uuid.uuid4().hex[:6]}"
    # A model large enough that its 600 steps take tens of seconds: the watch sees it Running, with an ETA.
    obj = job_manifest(name, namespace, steps=600, model={"name": "mlp", "hidden": 512, "layers": 4},
                       training={"evalIntervalSteps": 0, "logIntervalSteps": 20}, checkpoint={"intervalSteps": 300})  # fmt: skip
    # Submitted suspended and resumed once the watch and the follow below look at it: a 600-step
    # run takes ~30 s, and CLIs that start slowly on a busy host could otherwise first see it done.
    obj["spec"]["runPolicy"] = {"suspend": True}
    del obj["metadata"]["namespace"]  # the context's namespace applies
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    kc = with_context_namespace(kubectl.kubeconfig, namespace, tmp_path / "kubeconfig")

    submitted = cli(kc, "submit", str(manifest))
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.splitlines() == [
        f"DistTrainJob {name} created in namespace {namespace}",
        f"  follow it:  disttrain status {name} -n {namespace} -w",
        f"  its logs:   disttrain logs {name} -n {namespace} -f",
    ]
    again = cli(kc, "submit", str(manifest))  # the same file again: nothing to change
    assert again.returncode == 0 and f"{name} unchanged in namespace {namespace}" in again.stdout, again.stderr

    follow = background(kc, tmp_path / "follow.log", "logs", name, "-f")  # before its pod exists
    watch_log = tmp_path / "watch.log"
    watch = background(kubectl.kubeconfig, watch_log, "status", name, "-n", namespace, "-w", "--interval", "1")
    try:
        kubectl.wait_for("the watch to show the job suspended", lambda: ", Suspended" in _text(watch_log),
                         timeout=180, interval=0.5)  # fmt: skip
        kubectl.wait_for("the follow to wait for rank 0's pod", lambda: "waiting for" in _text(
            tmp_path / "follow.err"), timeout=180, interval=0.5)  # fmt: skip
        kubectl.run("patch", "dtj", name, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"runPolicy": {"suspend": False}}}))  # fmt: skip
        assert watch.wait(timeout=600) == 0, _text(watch_log) + _text(watch_log.with_suffix(".err"))
    finally:
        if watch.poll() is None:
            watch.kill()
    print(_text(watch_log))  # shown when the test fails
    lines = _text(watch_log).splitlines()
    # While it ran: a line with its progress and an ETA; at the end the whole picture with the result.
    assert any(re.search(r"  Running  step \d+/600 \([\d.]+%\), [\d,]+ samples/s, ETA \d", line) for line in lines), lines
    done = lines[lines.index("") + 1:]
    assert done[0] == f"DistTrainJob {name} in {namespace}: mode data, 2 x 1 processes, Succeeded", done
    assert re.search(r"^  progress    step 600/600 \(100(\.0)?%\)", "\n".join(done), re.M), done
    assert any(re.match(r"    testAccuracy +0\.\d", line) for line in done), done
    assert any(line.startswith("  restarts    0 of backoffLimit") for line in done)
    # Events: each one in the stream as it came; the final picture lists the latest few (a loaded host's
    # readings can add several ScalingHints after GangCreated).
    assert any(re.match(r"\d\d:\d\d:\d\d  event Normal GangCreated: ", line) for line in lines), lines
    assert any(re.match(r"events( \(last \d+ of \d+\))?:$", line) for line in done), done

    assert follow.wait(timeout=60) == 0, (tmp_path / "follow.err").read_text()
    rank0 = cli(kc, "logs", name, "--rank", "0", "--tail", "2")
    assert rank0.returncode == 0 and len(rank0.stdout.splitlines()) == 2, rank0
    print(rank0.stdout)
    rank0 = cli(kc, "logs", name, "--rank", "0")
    assert rank0.returncode == 0, rank0.stderr
    assert re.search(r"^step 600/600 loss ", rank0.stdout, re.M), rank0.stdout[-2000:]
    assert (tmp_path / "follow.log").read_text() == rank0.stdout  # followed from its first line to its last
    assert cli(kc, "logs", name, "--rank", "1").returncode == 0
    beyond = cli(kc, "logs", name, "--rank", "2")
    assert beyond.returncode == 2 and "rank 2 is not one of this job's ranks 0-1" in beyond.stderr

    status = cli(kc, "status", name)  # done: the same picture without -w
    assert status.returncode == 0 and "Succeeded" in status.stdout.splitlines()[0] and "  result" in status.stdout

    nobody = as_service_account(kubectl, namespace, tmp_path / "nobody")
    refused = cli(nobody, "status", name, "-n", namespace)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(f"disttrain status: forbidden (403): disttrainjobs.disttrain.dev \"{name}\" is "
                                     f"forbidden: User \"system:serviceaccount:{namespace}:nobody\" cannot get"), refused.stderr  # fmt: skip
    missing = cli(kc, "status", "no-such-job")
    assert missing.returncode == 1
    assert missing.stderr == (f"disttrain status: DistTrainJob no-such-job not found in namespace {namespace} "
                              f"(its jobs: {name}; -n NAMESPACE picks another)\n")  # fmt: skip

    deleted = cli(kc, "delete", name, "--wait", "--timeout", "120", timeout=180)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.splitlines()[-1] == f"DistTrainJob {name} and its pods are gone"
    assert kubectl.pods(namespace, name) == []
    assert cli(kc, "delete", name).returncode == 1 and cli(kc, "delete", name, "--ignore-not-found").returncode == 0


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_logs_follow_a_rank_across_a_gang_restart(kubectl: Kubectl, operator: OperatorProcess, namespace: str,
                                                  tmp_path: Path) -> None:  # fmt: skip
    name = f"clir-{uuid.uuid4().hex[:6]}"
    obj: dict[str, Any] = job_manifest(name, namespace, sleep=600)
    obj["spec"]["workers"]["resources"]["cpu"] = "100m"  # it only sleeps
    obj["spec"]["workers"]["template"]["containers"][0]["command"] = [
        "sh", "-c", "echo attempt $DISTTRAIN_RESTART_ATTEMPT rank $RANK; exec sleep 600"]
    kubectl.apply(obj)
    out = tmp_path / "follow.log"
    follow = background(kubectl.kubeconfig, out, "logs", name, "-n", namespace, "--rank", "1", "-f")
    try:
        kubectl.wait_for("attempt 0's line", lambda: "attempt 0 rank 1" in _text(out), timeout=180, interval=0.5)
        kubectl.run("delete", "pod", f"{name}-worker-1", "-n", namespace, "--wait=false")  # a disruption: a new gang
        kubectl.wait_for("attempt 1's line", lambda: "attempt 1 rank 1" in _text(out), timeout=180, interval=0.5)
        now = cli(kubectl.kubeconfig, "logs", name, "-n", namespace, "--rank", "1")
        assert now.returncode == 0 and now.stdout == "attempt 1 rank 1\n", now  # the current attempt's pod
        assert cli(kubectl.kubeconfig, "delete", name, "-n", namespace, "--wait", timeout=180).returncode == 0
        assert follow.wait(timeout=30) == 0  # the job is gone: nothing more to follow
    finally:
        if follow.poll() is None:
            follow.kill()
    # The pods' own lines only: the kubelet's words about a container it lost (appended to a
    # stream as its pod goes) are a note on stderr.
    assert _text(out) == "attempt 0 rank 1\nattempt 1 rank 1\n"
    err = _text(out.with_suffix(".err"))
    assert f"--- rank 1 (worker pod 1): pod {name}-worker-1, attempt 1 ---" in err, err
    assert f"--- DistTrainJob {name} was deleted ---" in err, err
