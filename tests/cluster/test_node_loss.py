"""Fault injection: a stopped node's pods end failed/evicted and get replaced on another node."""

from __future__ import annotations

import pytest
from kubernetes import client


@pytest.mark.whole_cluster  # stops a node
def test_stopping_a_node_evicts_its_pods_and_they_are_replaced(kube, namespace, local_cluster):
    labels = {"app": "survivor"}
    rs = client.V1ReplicaSet(
        metadata=client.V1ObjectMeta(name="survivor"),
        spec=client.V1ReplicaSetSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=kube.pod("x", command=["sleep", "3600"], restart_policy="Always").spec)))
    kube.apps.create_namespaced_replica_set(namespace, rs)

    def running() -> list[client.V1Pod]:
        pods = kube.core.list_namespaced_pod(namespace, label_selector="app=survivor").items
        return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]

    first = kube.wait(running, timeout=60, what="the first replica to run")[0]
    victim = first.spec.node_name
    local_cluster.stop_node(victim)
    try:
        def replaced() -> list[client.V1Pod]:
            return [p for p in running() if p.spec.node_name != victim]

        new = kube.wait(replaced, timeout=90, what=f"a replacement replica off {victim}")[0]
        assert new.metadata.name != first.metadata.name
        old = kube.core.read_namespaced_pod(first.metadata.name, namespace)
        assert old.metadata.deletion_timestamp is not None or old.status.phase == "Failed", old.status
        node = kube.core.read_node(victim)
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready != "True", f"{victim} should be NotReady after stop_node"
    finally:
        local_cluster.start_node(victim)
    assert {c.type: c.status for c in kube.core.read_node(victim).status.conditions}["Ready"] == "True"

    # The restarted kubelet finishes what the eviction began: the old pod object goes. (It stayed
    # Terminating for good when the node's containerd forgot its containers behind the CRI
    # plugin's back: every RemoveContainer answered NotFound.)
    def old_pod_gone() -> bool:
        names = {p.metadata.name for p in kube.core.list_namespaced_pod(namespace).items}
        return first.metadata.name not in names

    kube.wait(old_pod_gone, timeout=90, what=f"the restarted {victim} to finish deleting {first.metadata.name}")
