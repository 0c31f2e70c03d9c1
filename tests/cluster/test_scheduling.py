"""Extended resources: nvidia.com/gpu requests are really scheduled; the cluster's CPU weights."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client


def _gpu_pod(kube, name: str, gpus: int) -> client.V1Pod:
    limits = {"nvidia.com/gpu": str(gpus)}
    return kube.pod(name, command=["true"],
                    container={"resources": client.V1ResourceRequirements(limits=limits, requests=limits)})


def test_gpu_requests_are_scheduled_by_capacity(kube, namespace, local_cluster):
    gpu_nodes = [name for name, n in local_cluster.gpus.items() if n > 0]
    assert gpu_nodes, "the default local cluster advertises nvidia.com/gpu on its last node"
    most = max(local_cluster.gpus.values())

    kube.core.create_namespaced_pod(namespace, _gpu_pod(kube, "too-many", most + 7))
    kube.core.create_namespaced_pod(namespace, _gpu_pod(kube, "fits", 1))

    ok = kube.wait_phase(namespace, "fits", ("Succeeded",))
    assert ok.spec.node_name in gpu_nodes

    def failed_scheduling() -> bool:
        evs = kube.core.list_namespaced_event(namespace, field_selector="involvedObject.name=too-many").items
        return any(e.reason == "FailedScheduling" and "nvidia.com/gpu" in (e.message or "") for e in evs)

    kube.wait(failed_scheduling, timeout=30, what="a FailedScheduling event naming nvidia.com/gpu")
    p = kube.core.read_namespaced_pod("too-many", namespace)
    assert p.status.phase == "Pending" and not p.spec.node_name


def test_the_cluster_weighs_more_than_one_busy_host_process_for_cpu(local_cluster):
    """The whole cluster is one cgroup beside the host's processes (cgroup v1: each root
    process weighs as much as it): at the default weight a busy host starves every pod."""
    from localcluster.config import CGROUP_PARENT
    from localcluster.proc import CLUSTER_CPU_SHARES

    shares = Path("/sys/fs/cgroup/cpu") / CGROUP_PARENT / "cpu.shares"
    assert shares.exists(), "the local cluster runs under cgroup v1's cpu controller"
    assert int(shares.read_text()) == CLUSTER_CPU_SHARES > 1024


def test_the_control_plane_and_each_nodes_daemons_outweigh_the_pods_for_cpu(local_cluster):
    """Every daemon of the cluster runs in its cgroup of the cpu hierarchy at DAEMON_CPU_SHARES
    (more than a node's pods weigh): in the host's root cgroup the API server weighed as one
    process beside pods weighing eight, and a busy host answered the kubelets' lease renewals
    too late, so nodes turned NotReady and their pods were evicted."""
    from localcluster import controlplane, node
    from localcluster.config import CGROUP_PARENT
    from localcluster.proc import DAEMON_CPU_SHARES, cgroup_pids

    cpu = Path("/sys/fs/cgroup/cpu") / CGROUP_PARENT
    groups = [controlplane.CGROUP, *(node.system_cgroup(n) for n in local_cluster.cfg.nodes)]
    for rel in groups:
        pids = cgroup_pids(rel)
        assert pids, f"no daemon runs in cgroup {rel}"
        inside = {int(x) for x in (cpu / rel / "cgroup.procs").read_text().split()}
        assert pids <= inside, f"{rel}: processes {sorted(pids - inside)} are not in its cpu cgroup"
        assert int((cpu / rel / "cpu.shares").read_text()) == DAEMON_CPU_SHARES
    for n in local_cluster.cfg.nodes:  # the kubelet weighs its pods at the node's CPU capacity
        pods = int((cpu / node.cgroup_of(n) / "kubepods" / "cpu.shares").read_text())
        assert DAEMON_CPU_SHARES > pods, (n.name, pods)
