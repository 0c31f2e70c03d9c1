"""Operator side of mode paramserver: one server Deployment + Service per shard, and a failed
worker pod replaced alone (no gang restart)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from disttrain_api import constants as c
from disttrain_api import model as api
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView, format_time
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def spec(**ps: Any) -> api.JobSpec:
    return api.parse_spec({"mode": "paramserver", "workers": {"replicas": 3}, "paramServer": ps,
                           "runPolicy": {"backoffLimit": 2}})  # fmt: skip


def ctx() -> BuildContext:
    return BuildContext(name="job1", namespace="ns1", uid="u1", image="img", image_pull_policy="IfNotPresent",
                        attempt=0, replicas=3)  # fmt: skip


def env_of(obj: dict[str, Any]) -> dict[str, str]:
    spec_ = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    return {e["name"]: e["value"] for e in spec_["containers"][0]["env"] if "value" in e}


def test_each_shard_gets_its_own_deployment_and_service() -> None:
    children = build_children(spec(shards=2), ctx())
    names = [d["metadata"]["name"] for d in children.deployments]
    assert names == ["job1-server-0", "job1-server-1"]
    addrs = "job1-server-0.ns1.svc.cluster.local:50052,job1-server-1.ns1.svc.cluster.local:50052"
    for i, dep in enumerate(children.deployments):
        sel = dep["spec"]["selector"]["matchLabels"]
        assert sel == {c.LABEL_JOB: "job1", c.LABEL_ROLE: c.ROLE_SERVER, c.LABEL_REPLICA_INDEX: str(i)}
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert all(labels[k] == v for k, v in sel.items())  # the Deployment owns its template's pods
        env = env_of(dep)
        assert env[c.ENV_ROLE] == c.ROLE_SERVER and env[c.ENV_NODE_RANK] == str(i) and env[c.ENV_SERVER_ADDR] == addrs
        svc = next(s for s in children.services if s["metadata"]["name"] == f"job1-server-{i}")
        assert svc["spec"]["selector"] == sel
    for pod in children.pods:
        assert env_of(pod)[c.ENV_SERVER_ADDR] == addrs and env_of(pod)[c.ENV_ROLE] == c.ROLE_WORKER


def test_one_shard_keeps_the_plain_names() -> None:
    (dep,) = build_children(spec(), ctx()).deployments
    assert dep["metadata"]["name"] == "job1-server"
    assert c.LABEL_REPLICA_INDEX not in dep["spec"]["selector"]["matchLabels"]


def pod(index: int, phase: str = "Running", **kw: Any) -> PodView:
    values: dict[str, Any] = {"name": f"job1-worker-{index}", "role": "worker", "index": index, "attempt": 0,
                              "phase": phase, "scheduled": True, "ip": f"10.0.0.{index}"}  # fmt: skip
    values.update(kw)
    return PodView(**values)


STATUS = {
    "phase": "Running", "attempt": 0, "replicas": 3, "restarts": 0, "lastSpecReplicas": 3,
    "startTime": format_time(NOW - timedelta(seconds=30)), "observedGeneration": 1,
    "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"},
                   {"type": "Running", "status": "True", "reason": "GangRunning"}],
    "secrets": {"identity": "job1-identity-0a1b2c3d4e", "tls": "job1-tls-0a1b2c3d4e",
                "tlsNotAfter": format_time(NOW + timedelta(days=300))},
}  # fmt: skip


def observe(status: dict[str, Any], pods: list[PodView]) -> Observed:
    s = spec()
    return Observed(generation=1, spec=s, accepted=s, status=status, pods=pods, now=NOW)


def test_a_failed_worker_pod_is_replaced_alone_in_the_same_attempt() -> None:
    failed = pod(1, "Failed", exit_code=1, message="killed")
    plan = decide(observe(dict(STATUS), [pod(0), failed, pod(2)]))
    assert plan.delete_pods == ["job1-worker-1"] and not plan.create
    assert plan.status["restarts"] == 1 and plan.status["attempt"] == 0
    assert plan.status["phase"] == "Running"
    assert ("Warning", "WorkerReplaced") in [(t, r) for t, r, _ in plan.events]
    # Next pass: the pod is gone; it is created again (the others exist and stay), not counted twice.
    plan = decide(observe({**STATUS, "restarts": 1}, [pod(0), pod(2)]))
    assert plan.create and not plan.delete_pods and plan.status["restarts"] == 1 and plan.status["attempt"] == 0


def test_the_backoff_limit_still_fails_the_job() -> None:
    failed = pod(1, "Failed", exit_code=1, message="killed")
    plan = decide(observe({**STATUS, "restarts": 2}, [pod(0), failed, pod(2)]))
    assert plan.status["phase"] == "Failed"
    # A replacement counted before the limit was reached is still completed.
    plan = decide(observe({**STATUS, "restarts": 2}, [pod(0), pod(2)]))
    assert plan.create and plan.status["phase"] == "Running"


def test_a_paramserver_worker_pod_runs_one_process() -> None:
    from disttrain_api.validation import validate_spec

    bad = api.parse_spec({"mode": "paramserver", "workers": {"replicas": 2, "procsPerWorker": 2},
                          "data": {"batchSize": 64}})  # fmt: skip
    assert [str(e) for e in validate_spec(bad)] == [
        "spec.workers.procsPerWorker: must be 1 in mode paramserver (got 2); raise workers.replicas instead"
    ]
    good = api.parse_spec({"mode": "paramserver", "workers": {"replicas": 4}, "data": {"batchSize": 64},
                           "paramServer": {"shards": 2}})  # fmt: skip
    assert validate_spec(good) == []
