"""Operator side of spec.faultTolerance: the replicas' env and the job's lighthouse (Deployment,
Service, NetworkPolicy), a lost replica replaced alone while the job stays Running, the gang
restart below minReplicas, and status.replicaGroups with ReplicaLost / ReplicaJoined."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from disttrain_api import constants as C
from disttrain_api import metric_names as names
from disttrain_api import model as api
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView, format_time
from disttrain_operator.topology import BuildContext, build_children, server_deployments

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def ft_spec(min_replicas: int = 2) -> api.JobSpec:
    return api.parse_spec({"mode": "data", "workers": {"replicas": 3}, "data": {"batchSize": 96},
                           "faultTolerance": {"minReplicas": min_replicas, "heartbeatTimeoutSeconds": 3}})  # fmt: skip


def pod(index: int, phase: str = "Running", **kw: Any) -> PodView:
    values: dict[str, Any] = {"name": f"j-worker-{index}", "role": "worker", "index": index, "attempt": 0,
                              "phase": phase, "scheduled": phase != "Pending", "ip": f"10.0.0.{index}",
                              "uid": f"uid-{index}"}  # fmt: skip
    values.update(kw)
    return PodView(**values)


STATUS = {
    "phase": "Running", "attempt": 0, "replicas": 3, "restarts": 0, "lastSpecReplicas": 3,
    "startTime": format_time(NOW - timedelta(seconds=30)), "observedGeneration": 1,
    "conditions": [{"type": "Created", "status": "True", "reason": "GangCreated"},
                   {"type": "Running", "status": "True", "reason": "GangRunning"}],
}  # fmt: skip


def obs(pods: list[PodView], *, spec: api.JobSpec | None = None, status: dict[str, Any] | None = None,
        progress: dict[str, float] | None = None) -> Observed:  # fmt: skip
    s = spec or ft_spec()
    return Observed(generation=1, spec=s, accepted=s, status=dict(status or STATUS), pods=pods, now=NOW,
                    progress=progress)  # fmt: skip


def env_of(obj: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in obj["spec"]["containers"][0]["env"]}


def test_replicas_are_worlds_of_one_and_the_job_owns_a_lighthouse() -> None:
    ctx = BuildContext(name="j", namespace="ns", uid="u", image="img", replicas=3)
    children = build_children(ft_spec(), ctx)
    lighthouse = "http://j-lighthouse.ns.svc.cluster.local:29510"
    for i, p in enumerate(children.pods):
        env = env_of(p)
        assert env[C.ENV_MASTER_ADDR] == f"j-worker-{i}.j.ns.svc.cluster.local"  # its own address, not rank 0's
        assert (env[C.ENV_WORLD_SIZE], env[C.ENV_RANK], env[C.ENV_NODE_RANK]) == ("1", "0", "0")
        assert env[C.ENV_FT_REPLICA] == str(i) and env[C.ENV_FT_LIGHTHOUSE] == lighthouse
    (dep,) = children.deployments
    assert dep["metadata"]["name"] == "j-lighthouse" and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "u"
    tmpl = dep["spec"]["template"]
    env = env_of(tmpl)
    assert env[C.ENV_ROLE] == C.ROLE_LIGHTHOUSE and env[C.ENV_FT_LIGHTHOUSE] == lighthouse
    assert tmpl["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "250m", "memory": "512Mi"}
    # It holds no model: the checkpoints are read-only to it, as to every pod that does not write them.
    mounts = {m["name"]: m for m in tmpl["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["checkpoints"].get("readOnly") is True
    assert all(mounts["checkpoints"].get("readOnly") is None for mounts in
               ({m["name"]: m for m in p["spec"]["containers"][0]["volumeMounts"]} for p in children.pods))
    svc = next(s for s in children.services if s["metadata"]["name"] == "j-lighthouse")
    assert svc["spec"]["ports"][0]["port"] == C.DEFAULT_LIGHTHOUSE_PORT
    assert svc["spec"]["selector"] == {C.LABEL_JOB: "j", C.LABEL_ROLE: C.ROLE_LIGHTHOUSE}
    policy = next(p for p in children.network_policies if p["spec"]["podSelector"]["matchLabels"].get(C.LABEL_ROLE)
                  == C.ROLE_LIGHTHOUSE)  # fmt: skip
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": C.DEFAULT_LIGHTHOUSE_PORT}]
    assert server_deployments(ft_spec(), "j") == ["j-lighthouse"]
    # Without faultTolerance: the gang as before, no lighthouse.
    plain = build_children(api.parse_spec({"mode": "data", "workers": {"replicas": 3}, "data": {"batchSize": 96}}), ctx)
    assert not plain.deployments and env_of(plain.pods[1])[C.ENV_MASTER_ADDR] == "j-worker-0.j.ns.svc.cluster.local"


def test_a_lost_replica_is_replaced_alone_and_the_job_stays_running() -> None:
    plan = decide(obs([pod(0), pod(1, "Failed", exit_code=137, message="killed"), pod(2)]))
    st = plan.status
    assert plan.delete_pods == ["j-worker-1"] and not plan.create
    assert st["phase"] == "Running" and st["attempt"] == 0 and st["restarts"] == 1
    assert st["replicaGroups"]["lost"] == 1 and st["replicaGroups"]["healthy"] == 2
    assert [r for _, r, _ in plan.events] == ["ReplicaLost"]
    assert "j-worker-1 was killed by SIGKILL (exit code 137)" in plan.events[0][2]
    # Gone: created again alone, in the same attempt; still Running while it starts.
    nxt = decide(obs([pod(0), pod(2)], status=st))
    assert nxt.create and not nxt.delete_pods and nxt.status["phase"] == "Running" and nxt.status["restarts"] == 1
    starting = decide(obs([pod(0), pod(1, "Pending"), pod(2)], status=nxt.status))
    assert starting.status["phase"] == "Running" and not starting.create and not starting.delete_pods


def test_replaced_replicas_count_against_backoff_limit_and_the_one_past_it_fails_the_job() -> None:
    """A replica that crashes again and again must not be replaced for ever: each replacement is a
    restart, and the failure after backoffLimit of them fails the job as a gang restart would."""
    spec = api.parse_spec({"mode": "data", "workers": {"replicas": 3}, "data": {"batchSize": 96},
                           "runPolicy": {"backoffLimit": 2},
                           "faultTolerance": {"minReplicas": 2, "heartbeatTimeoutSeconds": 3}})  # fmt: skip
    st: dict[str, Any] = dict(STATUS)
    for n in (1, 2):  # under the limit: replaced alone, still Running
        failed = pod(1, "Failed", exit_code=1, message="crash", uid=f"uid-1-{n}")
        plan = decide(obs([pod(0), failed, pod(2)], spec=spec, status=st))
        assert plan.delete_pods == ["j-worker-1"] and plan.status["phase"] == "Running"
        assert plan.status["restarts"] == n and plan.status["attempt"] == 0
        st = decide(obs([pod(0), pod(2)], spec=spec, status=plan.status)).status  # gone, created again
    plan = decide(obs([pod(0), pod(1, "Failed", exit_code=1, message="crash", uid="uid-1-3"), pod(2)],
                      spec=spec, status=st))  # fmt: skip
    assert plan.status["phase"] == "Failed" and plan.status["restarts"] == 2
    failed_cond = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed_cond["reason"] == "BackoffLimitExceeded" and "runPolicy.backoffLimit=2" in failed_cond["message"]
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-2"]  # the replicas still training stop


def test_a_deleted_replica_pod_is_a_disruption_replaced_alone() -> None:
    plan = decide(obs([pod(0), pod(1, deleting=True, deleting_for_s=1), pod(2)]))
    assert plan.status["phase"] == "Running" and plan.status["disruptions"] == 1 and plan.status["restarts"] == 0
    assert [r for _, r, _ in plan.events] == ["ReplicaLost"]


def test_below_min_replicas_the_gang_restarts() -> None:
    plan = decide(obs([pod(0), pod(1, "Failed", exit_code=1), pod(2, "Failed", exit_code=1)]))
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1", "j-worker-2"]
    assert plan.status["replicaGroups"]["quorum"] == 0


def test_quorum_in_status_and_replica_joined_when_it_grows() -> None:
    reading = {names.STEP: 40.0, names.FT_QUORUM_SIZE: 2.0, names.FT_QUORUM_ID: 5.0}
    after_loss = {**STATUS, "replicaGroups": {"quorum": 3, "quorumId": 4, "lost": 1, "joined": 0}}
    first = decide(obs([pod(0), pod(1), pod(2)], status=after_loss, progress=reading))
    assert first.status["replicaGroups"] == {"healthy": 3, "quorum": 2, "quorumId": 5, "lost": 1, "joined": 0}
    assert not first.events
    grown = decide(obs([pod(0), pod(1), pod(2)], status=first.status,
                       progress={**reading, names.FT_QUORUM_SIZE: 3.0, names.FT_QUORUM_ID: 6.0}))  # fmt: skip
    assert grown.status["replicaGroups"]["quorum"] == 3 and grown.status["replicaGroups"]["joined"] == 1
    assert [r for _, r, _ in grown.events] == ["ReplicaJoined"]


def test_a_gang_gathering_at_its_start_is_not_a_rejoin() -> None:
    # The first reading of a starting gang can be 0 (its gauge before the first quorum), and the
    # replicas slower to import torch than minReplicas others join the quorum a few steps late:
    # neither is a replacement recovering, since no replica was lost.
    st = dict(STATUS)
    for q, qid in ((0, 1), (2, 2), (3, 3)):
        plan = decide(obs([pod(0), pod(1), pod(2)], status=st,
                          progress={names.STEP: 5.0, names.FT_QUORUM_SIZE: float(q), names.FT_QUORUM_ID: float(qid)}))  # fmt: skip
        assert not plan.events, plan.events
        st = plan.status
    assert st["replicaGroups"]["joined"] == 0 and st["replicaGroups"]["quorum"] == 3


def test_an_hsdp_replica_pod_is_a_world_of_its_processes() -> None:
    # The pod's launcher spawns procsPerWorker processes (no RANK: each derives its own from
    # LOCAL_RANK, NODE_RANK 0); they shard the model among themselves and form one replica group.
    spec = api.parse_spec({"mode": "data", "workers": {"replicas": 2, "procsPerWorker": 2}, "data": {"batchSize": 64},
                           "parallelism": {"dataStrategy": "fsdp"}, "faultTolerance": {"minReplicas": 1}})  # fmt: skip
    children = build_children(spec, BuildContext(name="j", namespace="ns", uid="u", image="img", replicas=2))
    for i, p in enumerate(children.pods):
        env = env_of(p)
        assert (env[C.ENV_WORLD_SIZE], env[C.ENV_NPROC_PER_NODE], env[C.ENV_NODE_RANK]) == ("2", "2", "0")
        assert C.ENV_RANK not in env and C.ENV_LOCAL_RANK not in env
        assert env[C.ENV_FT_REPLICA] == str(i) and env[C.ENV_MASTER_ADDR] == f"j-worker-{i}.j.ns.svc.cluster.local"
