"""Pod JSON -> PodView, summary and Prometheus parsing, settings."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from disttrain_api import constants as c
from disttrain_operator.observe import parse_prometheus, parse_summary, pod_view
from disttrain_operator.settings import from_env

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def raw(phase: str, **status: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "j-worker-1", "creationTimestamp": "2026-01-01T11:59:00Z",
            "labels": {c.LABEL_ROLE: "worker", c.LABEL_REPLICA_INDEX: "1", c.LABEL_RESTART_ATTEMPT: "2"},
        },
        "status": {"phase": phase, **status},
    }


def test_failed_pod_with_termination_message() -> None:
    p = pod_view(raw("Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": {
        "exitCode": 137, "reason": "Error", "message": "killed\n"}}}]), NOW)
    assert (p.index, p.attempt, p.phase, p.exit_code, p.message, p.age_s) == (1, 2, "Failed", 137, "killed", 60.0)


def test_owner_is_the_controller_reference() -> None:
    pod = raw("Running")
    assert (pod_view(pod, NOW).owner_uid, pod_view(pod, NOW).owner_kind) == ("", "")  # an orphan
    pod["metadata"]["ownerReferences"] = [  # type: ignore[index]
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm-uid"},
        {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "name": "j", "uid": "job-uid",
         "controller": True, "blockOwnerDeletion": True},
    ]
    v = pod_view(pod, NOW)
    assert (v.owner_uid, v.owner_kind) == ("job-uid", "DistTrainJob")


def test_unschedulable_and_node_lost() -> None:
    p = pod_view(raw("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                              "message": "0/2 nodes: Insufficient nvidia.com/gpu"}]), NOW)
    assert "Insufficient nvidia.com/gpu" in p.unschedulable_message and not p.scheduled
    p = pod_view(raw("Running", podIP="10.244.1.5",
                     conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T11:59:40Z"},
                                 {"type": "PodScheduled", "status": "True"}],
                     containerStatuses=[{"name": "trainer", "state": {"running": {}}}]), NOW)
    assert p.not_ready_for_s == 20.0 and p.scheduled and p.ip == "10.244.1.5"


def test_a_pod_is_stopped_only_when_every_container_has_terminated() -> None:
    term = {"terminated": {"exitCode": 137}}
    assert pod_view(raw("Running", containerStatuses=[{"name": "trainer", "state": term}]), NOW).stopped
    assert not pod_view(raw("Running"), NOW).stopped  # no status from its kubelet yet
    assert not pod_view(raw("Running", containerStatuses=[{"name": "trainer", "state": term},
                                                          {"name": "side", "state": {"running": {}}}]), NOW).stopped
    # A container waiting without an ID may be in the middle of its creation.
    creating = {"waiting": {"reason": "ContainerCreating"}}
    assert not pod_view(raw("Pending", containerStatuses=[{"name": "trainer", "state": creating}]), NOW).stopped
    init_running = raw("Pending", initContainerStatuses=[{"name": "init", "state": {"running": {}}}],
                       containerStatuses=[{"name": "trainer", "state": term}])
    assert not pod_view(init_running, NOW).stopped


def test_summary_and_prometheus() -> None:
    assert parse_summary('{"testAccuracy": 0.96}') == {"testAccuracy": 0.96}
    assert parse_summary("Traceback ...") is None and parse_summary("{broken") is None
    text = '# HELP x\ndisttrain_step{job="j",rank="0",mode="data"} 42.0\ndisttrain_last_checkpoint_step{job="j"} 40\n'
    assert parse_prometheus(text, ("disttrain_step", "disttrain_last_checkpoint_step")) == {
        "disttrain_step": 42.0, "disttrain_last_checkpoint_step": 40.0}


def test_settings_from_env_and_flags() -> None:
    s = from_env({"DISTTRAIN_OPERATOR_NAMESPACE": "a,b", "DISTTRAIN_OPERATOR_METRICS_PORT": "9000"},
                 default_image="x:1", metrics_port=None)
    assert s.namespaces == ("a", "b") and s.metrics_port == 9000 and s.default_image == "x:1"
    assert s.watch_namespaces() == ["a", "b"]
    assert from_env({}, all_namespaces=True).watch_namespaces() == []
    with pytest.raises(ValueError, match="not both"):
        from_env({"DISTTRAIN_OPERATOR_NAMESPACE": "a"}, all_namespaces=True)


def test_settings_reject_non_numbers_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="DISTTRAIN_OPERATOR_METRICS_PORT='tcp://10.96.0.9:8080' is not a number"):
        from_env({"DISTTRAIN_OPERATOR_METRICS_PORT": "tcp://10.96.0.9:8080"})


@pytest.mark.parametrize(("status", "says"), [
    ({"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "True",
                                          "reason": "PreemptionByScheduler", "message": "preempted by p"}]},
     "disrupted (PreemptionByScheduler: preempted by p)"),
    ({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}, "evicted by its kubelet: low on memory"),
    ({"phase": "Failed", "reason": "Preempting"}, "preempted by its kubelet"),
    ({"phase": "Failed", "reason": "Terminated"}, "node shutdown"),
    ({"phase": "Failed", "reason": "Shutdown"}, "node shutdown"),
    ({"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 3}}}],
      "deleting": True}, "stopped on request (exit code 3)"),
])  # fmt: skip
def test_disruptions_are_recognised_from_the_pod(status: dict[str, object], says: str) -> None:
    status = dict(status)
    pod = raw(**{k: v for k, v in status.items() if k != "deleting"})  # type: ignore[arg-type]
    if status.get("deleting"):
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:58Z"  # type: ignore[index]
    p = pod_view(pod, NOW)
    assert says in p.disruption and p.disruption.startswith("pod j-worker-1 ")


def test_exit_3_is_a_disruption_only_when_a_stop_was_asked_for() -> None:
    """The trainer exits 3 after SIGTERM; only a deletion (deletionTimestamp: the operator's, a
    drain's, a user's) or a DisruptionTarget condition says that someone asked for the stop."""
    stopped = {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 3}}}]}
    assert pod_view(raw(**stopped), NOW).disruption == ""  # type: ignore[arg-type]  # its own code exited 3
    target = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    assert "PreemptionByScheduler" in pod_view(raw(**stopped, conditions=target), NOW).disruption  # type: ignore[arg-type]
    deleted = raw(**stopped)  # type: ignore[arg-type]
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:58Z"  # type: ignore[index]
    assert "stopped on request" in pod_view(deleted, NOW).disruption


@pytest.mark.parametrize("status", [
    {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 1}}}]},
    {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 137}}}]},
    {"phase": "Failed", "reason": "OutOfcpu", "message": "Node didn't have enough resource: cpu"},
    {"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "False"}]},
    {"phase": "Running", "reason": "Evicted"},  # only a pod that ended was evicted
])  # fmt: skip
def test_failures_and_running_pods_are_not_disruptions(status: dict[str, object]) -> None:
    assert pod_view(raw(**status), NOW).disruption == ""  # type: ignore[arg-type]
