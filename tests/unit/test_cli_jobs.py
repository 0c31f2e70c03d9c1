"""The job commands' pure parts (submit, status, logs, delete): how a job is shown, which pod's log
is read, how the cluster's refusals read, kubectl's kubeconfig conventions; and the commands
themselves where no cluster is needed (a refused port, an invalid manifest). The commands
against a real API server: tests/e2e/test_cli.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from disttrain_cli import cluster, job_view, pod_choice

NOW = datetime(2026, 1, 1, 12, 10, 0, tzinfo=UTC)
DISTTRAIN = str(Path(sys.executable).parent / "disttrain")


def _job(phase: str = "Running", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob",
        "metadata": {"name": "digits", "namespace": "ml", "uid": "u-1"},
        "spec": {"mode": "data", "workers": {"replicas": 2, "procsPerWorker": 2}, "training": {"steps": 400},
                 "runPolicy": {"backoffLimit": 3}},
        "status": {"phase": phase, "replicas": 2, "step": 120, "restarts": 1, "disruptions": 2,
                   "startTime": "2026-01-01T12:00:00Z", **status},
    }  # fmt: skip


PROGRESS = {"completed": 120, "total": 400, "unit": "steps", "percent": 30.0, "rate": 2.0,
            "samplesPerSecond": 1234.0, "etaSeconds": 140, "eta": "2m20s"}  # fmt: skip


def _event(name: str, reason: str, at: str, type_: str = "Normal", count: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": name}, "reason": reason, "type": type_, "count": count,
            "message": f"{reason} happened", "lastTimestamp": at}  # fmt: skip


# ---------------------------------------------------------------------------------------- status


def test_a_running_job_shows_progress_eta_restarts_hint_and_the_last_events() -> None:
    job = _job(progress=PROGRESS, lastCheckpointStep=100, commFraction=0.381,
               hint="exposed communication 38% of the step: dp4 powersgd forecast +20% samples/s over dp4",
               workers={"active": 2, "pending": 0, "succeeded": 0, "failed": 0},
               conditions=[{"type": "Running", "status": "True", "reason": "GangRunning"},
                           {"type": "ChildRejected", "status": "True", "reason": "Forbidden", "message": "quota"},
                           {"type": "InvalidSpec", "status": "False", "reason": "SpecValid"}])  # fmt: skip
    events = [_event(f"e{i}", f"Reason{i}", f"2026-01-01T12:0{i}:00Z") for i in range(7)]
    text = job_view.render(job, events, NOW, event_limit=3)
    lines = text.splitlines()
    assert lines[0] == "DistTrainJob digits in ml: mode data, 2 x 2 processes, Running"
    assert "  progress    step 120/400 (30.0%), 1,234 samples/s, ETA 2m20s" in lines
    assert "  checkpoint  step 100" in lines
    assert "  restarts    1 of backoffLimit 3, disruptions 2 (not counted against it)" in lines
    assert any(line.startswith("  hint        exposed communication 38%") for line in lines)
    assert "  comm        38.1% of rank 0's step time waiting on communication" in lines
    assert "  condition   ChildRejected (Forbidden): quota" in lines
    assert "InvalidSpec" not in text and "GangRunning" not in text  # only conditions that need attention
    assert "  started     2026-01-01T12:00:00Z (10m00s ago)" in lines
    assert "result" not in text  # not before it finished
    assert lines[-4] == "events (last 3 of 7):"
    assert [line.split()[3] for line in lines[-3:]] == ["Reason4:", "Reason5:", "Reason6:"]  # newest last
    assert lines[-1].strip().startswith("4m00s ago  Normal   Reason6: Reason6 happened")


def test_a_finished_job_shows_its_result_and_how_long_it_took() -> None:
    result = {"testAccuracy": 0.96944, "finalLoss": 0.0117, "steps": 400, "device": "cpu", "wallS": 5.43,
              "aaa": "first of the rest", "export": {"path": "/checkpoints/digits/export", "format": "safetensors"},
              "pipeline": {"perStage": []}}  # fmt: skip
    job = _job("Succeeded", progress={**PROGRESS, "completed": 400, "percent": 100.0, "eta": "0s"},
               completionTime="2026-01-01T12:05:30Z", result=result)  # fmt: skip
    lines = job_view.render(job, [], NOW).splitlines()
    assert "  finished    2026-01-01T12:05:30Z (4m30s ago, took 5m30s)" in lines
    i = lines.index("  result")
    assert lines[i + 1:i + 8] == [
        "    testAccuracy  0.9694", "    finalLoss     0.0117", "    steps         400", "    wallS         5.43",
        "    device        cpu", "    aaa           first of the rest", "    export        /checkpoints/digits/export",
    ]  # fmt: skip
    assert lines[-1] == "events: none"


def test_a_job_the_operator_has_not_seen_yet_and_an_event_that_repeats() -> None:
    job = {"metadata": {"name": "new", "namespace": "ml", "uid": "u"}, "spec": {"training": {"steps": 50}}}
    text = job_view.render(job, [_event("e", "BackoffLimitExceeded", "2026-01-01T12:09:00Z", "Warning", 3)], NOW)
    assert text.splitlines()[0].endswith("Pending")
    assert "  progress    step 0/50, no rate yet" in text.splitlines()
    assert "Warning  BackoffLimitExceeded: BackoffLimitExceeded happened (x3)" in text
    assert job_view.headline(_job(progress=PROGRESS)) == \
        "Running  step 120/400 (30.0%), 1,234 samples/s, ETA 2m20s  restarts 1  disruptions 2"


# ------------------------------------------------------------------------------------ which pod


def _pod(name: str, role: str, index: int, attempt: int, *, owner: str = "u-1", kind: str = "DistTrainJob",
         deleting: bool = False, created: str = "2026-01-01T12:00:00Z", state: str = "running") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "uid": f"{name}-{attempt}-{created}", "creationTimestamp": created,
        "labels": {"disttrain.dev/job-name": "digits", "disttrain.dev/role": role,
                   "disttrain.dev/replica-index": str(index), "disttrain.dev/restart-attempt": str(attempt)},
        "ownerReferences": [{"kind": kind, "uid": owner, "controller": True}],
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:09:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [{"name": "trainer", "state": {state: {"reason": "X"}}}]}}


def test_ranks_and_roles_name_the_pod_that_runs_them() -> None:
    data = _job()  # 2 pods x 2 processes
    assert pod_choice.target_for(data, rank=None, role=None, index=None) == pod_choice.Target("worker", 0, "rank 0 (worker pod 0)")
    assert pod_choice.target_for(data, rank=3, role=None, index=None).index == 1
    with pytest.raises(ValueError, match="rank 4 is not one of this job's ranks 0-3"):
        pod_choice.target_for(data, rank=4, role=None, index=None)
    with pytest.raises(ValueError, match="a data job has no aggregator pods"):
        pod_choice.target_for(data, rank=None, role="aggregator", index=None)
    fed = {"spec": {"mode": "federated", "workers": {"replicas": 3}}, "status": {}}
    assert pod_choice.target_for(fed, rank=None, role=None, index=None).role == "aggregator"
    assert pod_choice.target_for(fed, rank=2, role=None, index=None) == pod_choice.Target("client", 2, "rank 2 (client pod 2)")
    ps = {"spec": {"mode": "paramserver", "workers": {"replicas": 2}, "paramServer": {"shards": 2}}}
    assert pod_choice.target_for(ps, rank=None, role="server", index=1) == pod_choice.Target("server", 1, "server 1")
    with pytest.raises(ValueError, match="server index 2 is not one of 0-1"):
        pod_choice.target_for(ps, rank=None, role="server", index=2)
    assert pod_choice.Target("worker", 1, "").selector("digits") == \
        "disttrain.dev/job-name=digits,disttrain.dev/role=worker,disttrain.dev/replica-index=1"


def test_after_a_restart_the_current_attempts_pod_is_chosen() -> None:
    old = _pod("digits-worker-1", "worker", 1, 0, deleting=True, state="terminated")
    new = _pod("digits-worker-1", "worker", 1, 1, state="waiting")
    assert pod_choice.pick([old, new], "u-1") is new
    assert not pod_choice.has_log(new, "trainer") and pod_choice.container_state(new, "trainer") == ("waiting", "X")
    # A Deployment's replacement pod (its owner a ReplicaSet): the newest live one.
    agg_old = _pod("digits-aggregator-5d-a", "aggregator", 0, 0, kind="ReplicaSet", owner="rs", deleting=True)
    agg_new = _pod("digits-aggregator-5d-b", "aggregator", 0, 0, kind="ReplicaSet", owner="rs",
                   created="2026-01-01T12:08:00Z")  # fmt: skip
    assert pod_choice.pick([agg_new, agg_old], "u-1") is agg_new
    # A pod of an earlier job of the same name, or a user's pod wearing the label, is not the job's.
    assert pod_choice.pick([_pod("digits-worker-0", "worker", 0, 5, owner="other-uid")], "u-1") is None
    unowned = _pod("x", "worker", 0, 0)
    unowned["metadata"]["ownerReferences"] = []
    assert pod_choice.pick([unowned], "u-1") is None
    assert pod_choice.container_state({"status": {"phase": "Pending"}}, "trainer") == ("waiting", "Pending")


# ------------------------------------------------------------------------------- errors, kubeconfig


def test_the_clusters_refusals_read_as_sentences() -> None:
    where, ns = "https://k:6443 (context c)", "ml"
    forbidden = ('{"kind":"Status","message":"disttrainjobs.disttrain.dev \\"x\\" is forbidden: User \\"bob\\" '
                 'cannot get resource \\"disttrainjobs\\"","reason":"Forbidden","code":403}')  # fmt: skip
    err = cluster.api_error(403, forbidden, where=where, namespace=ns)
    assert str(err).startswith('forbidden (403): disttrainjobs.disttrain.dev "x" is forbidden: User "bob"')
    assert "RBAC in namespace ml" in str(err) and err.exit_code == 1
    missing = '{"message":"disttrainjobs.disttrain.dev \\"x\\" not found","details":{"name":"x"},"code":404}'
    assert isinstance(cluster.api_error(404, missing, where=where, namespace=ns), cluster.NotFound)
    no_crd = cluster.api_error(404, b"404 page not found", where=where, namespace=ns)
    assert not isinstance(no_crd, cluster.NotFound) and "install the CRD" in str(no_crd)
    assert "401 Unauthorized" in str(cluster.api_error(401, "", where=where, namespace=ns))
    invalid = cluster.api_error(422, '{"message":"spec.mode: Unsupported value"}', where=where, namespace=ns)
    assert invalid.exit_code == 2 and "spec.mode: Unsupported value" in str(invalid)
    assert isinstance(cluster.api_error(409, "{}", where=where, namespace=ns), cluster.Conflict)


KUBECONFIG = {
    "apiVersion": "v1", "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "team", "context": {"cluster": "c", "user": "u", "namespace": "team-ns"}},
                 {"name": "bare", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "team",
}  # fmt: skip


def test_kubectls_kubeconfig_conventions(tmp_path: Path) -> None:
    main = tmp_path / "config"
    main.write_text(yaml.safe_dump(KUBECONFIG))
    other = tmp_path / "other"
    other.write_text(yaml.safe_dump({**KUBECONFIG, "current-context": "bare", "clusters": [
        {"name": "c", "cluster": {"server": "https://10.9.9.9:6443"}}]}))  # fmt: skip
    env = {"KUBECONFIG": f"{tmp_path / 'absent'}:{main}:{other}"}  # merged; missing files skipped, first wins
    conn = cluster.connect(kubeconfig=None, context=None, namespace=None, env=env)
    assert conn.namespace == "team-ns" and conn.where == "https://127.0.0.1:1 (context team)"
    assert cluster.connect(kubeconfig=None, context="bare", namespace=None, env=env).namespace == "default"
    assert cluster.connect(kubeconfig=None, context=None, namespace="mine", env=env).namespace == "mine"
    flagged = cluster.connect(kubeconfig=str(other), context=None, namespace=None, env=env)  # the flag wins
    assert flagged.where == "https://10.9.9.9:6443 (context bare)" and flagged.namespace == "default"
    with pytest.raises(cluster.ClusterError, match=r"context nope is not in KUBECONFIG=.* \(its contexts: bare, team\)"):
        cluster.connect(kubeconfig=None, context="nope", namespace=None, env=env)
    with pytest.raises(cluster.ClusterError, match="kubeconfig /no/such/file does not exist"):
        cluster.connect(kubeconfig="/no/such/file", context=None, namespace=None, env=env)
    with pytest.raises(cluster.ClusterError, match="no kubeconfig: KUBECONFIG=/no/a:/no/b does not exist"):
        cluster.connect(kubeconfig=None, context=None, namespace=None, env={"KUBECONFIG": "/no/a:/no/b"})
    home = cluster.kubeconfig_files(None, {})
    assert home == ([str(Path("~/.kube/config").expanduser())], "~/.kube/config")


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DISTTRAIN, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_no_cluster_reachable_is_one_clear_line_and_exit_1(tmp_path: Path) -> None:
    """A real refused connection (port 1 on loopback), through the installed command."""
    kc = tmp_path / "config"
    kc.write_text(yaml.safe_dump(KUBECONFIG))
    for args in (["status", "j"], ["submit", "-"]):  # every command connects through with_cluster
        out = _cli(*args, "--kubeconfig", str(kc), stdin=GOOD_JOB)
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr.startswith(f"disttrain {args[0]}: cannot reach the Kubernetes API server at "
                                     "https://127.0.0.1:1 (context team): "), out.stderr  # fmt: skip
        assert "Connection refused" in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


GOOD_JOB = "apiVersion: disttrain.dev/v1alpha1\nkind: DistTrainJob\nmetadata: {name: ok}\nspec: {mode: data}\n"


def test_submit_validates_first_and_sends_nothing_invalid(tmp_path: Path) -> None:
    kc = tmp_path / "config"
    kc.write_text(yaml.safe_dump(KUBECONFIG))  # unreachable: had it tried, the error would say so
    bad = GOOD_JOB.replace("spec: {mode: data}", "spec: {mode: data, workers: {replicas: 2}, parallelism: {tensor: 3}}")
    out = _cli("submit", "-", "--kubeconfig", str(kc), stdin=bad)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "<stdin>: spec.parallelism.tensor: 3 does not divide the world size 2 (workers.replicas 2 x procsPerWorker 1)",
        "<stdin>: spec.parallelism.tensor: must be 1 in mode data (got 3); tensor parallelism needs mode tensor or hybrid",
        "disttrain submit: <stdin> is not valid; nothing was submitted",
    ]  # fmt: skip
    # The manifest's namespace and -n must agree (kubectl's rule), before any request.
    other_ns = GOOD_JOB.replace("{name: ok}", "{name: ok, namespace: a}")
    out = _cli("submit", "-", "--kubeconfig", str(kc), "-n", "b", stdin=other_ns)
    assert out.returncode == 2 and "ok: the manifest's namespace a is not -n b" in out.stderr
    assert _cli("logs", "j", "--index", "1").returncode == 2  # --index without --role
