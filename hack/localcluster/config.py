"""Addresses, paths and per-node settings of the local cluster, decided once here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

K8S_VERSION = "v1.20.2"
BRIDGE = "dtbr0"
BRIDGE_IP = "10.250.0.1"
BRIDGE_CIDR = "10.250.0.0/24"
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
APISERVER_PORT = 6443
ETCD_CLIENT_PORT = 12379
ETCD_PEER_PORT = 12380
CLUSTER_DOMAIN = "cluster.local"
# Host-side netfilter chain holding our FORWARD accept rules, so cleanup removes exactly ours.
FORWARD_CHAIN = "DISTTRAIN-FWD"
CGROUP_PARENT = "disttrain"
PAUSE_IMAGE = "k8s.gcr.io/pause:3.2"
TEST_IMAGE = "docker.io/library/disttrain-test:dev"
TRAINER_IMAGE = "docker.io/library/disttrain-trainer:dev"
OPERATOR_IMAGE = "docker.io/library/disttrain-operator:dev"
# The example user image (examples/my_model: the trainer image with a user's model package).
USER_IMAGE = "docker.io/library/disttrain-my-model:dev"
CHECKPOINT_DIR = Path("/var/lib/disttrain/checkpoints")
REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("DISTTRAIN_CACHE", Path.home() / ".cache" / "disttrain"))


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """One node: a network namespace with its own containerd, kubelet and kube-proxy."""

    index: int  # 1-based
    gpus: int = 0

    @property
    def name(self) -> str:
        return f"dt-node{self.index}"

    @property
    def ip(self) -> str:
        # node i at 10.250.0.1i (11, 12, ...), so 9 nodes at most
        return f"10.250.0.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def veth_host(self) -> str:
        return f"dtv{self.index}"


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...] = field(
        default_factory=lambda: (NodeConfig(index=1), NodeConfig(index=2, gpus=2))
    )
    root: Path = field(default_factory=lambda: cache_dir() / "cluster")
    ready_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not 1 <= len(self.nodes) <= 9:
            raise ValueError(f"nodes: 1..9 nodes supported, got {len(self.nodes)}")

    @classmethod
    def from_env(cls, nodes: int | None = None, gpus: str | None = None) -> ClusterConfig:
        """DISTTRAIN_NODES (default 2) and DISTTRAIN_GPUS ("1=0,2=2": node index = GPU count;
        default: the last node advertises 2 nvidia.com/gpu, the others none)."""
        n = nodes if nodes is not None else int(os.environ.get("DISTTRAIN_NODES", "2"))
        spec = gpus if gpus is not None else os.environ.get("DISTTRAIN_GPUS", f"{n}=2")
        per: dict[int, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, val = part.partition("=")
            try:
                per[int(key)] = int(val)
            except ValueError:
                raise ValueError(
                    f"DISTTRAIN_GPUS: bad entry {part!r}; write NODE_INDEX=COUNT, e.g. '2=2'"
                ) from None
        return cls(nodes=tuple(NodeConfig(index=i, gpus=per.get(i, 0)) for i in range(1, n + 1)))

    # --- paths -------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    def node_dir(self, node: NodeConfig) -> Path:
        return self.root / "nodes" / node.name

    def node_image_store(self, node: NodeConfig) -> Path:
        # Kept across cluster-down (an image cache), so warm starts need no re-import.
        return cache_dir() / "containerd" / node.name

    def node_state(self, node: NodeConfig) -> Path:
        return Path("/run/disttrain") / node.name

    def node_socket(self, node: NodeConfig) -> Path:
        return self.node_state(node) / "containerd.sock"

    def node_mountns(self, node: NodeConfig) -> Path:
        return Path("/run/disttrain/mnt") / node.name

    def node_netns(self, node: NodeConfig) -> Path:
        return Path("/var/run/netns") / node.name

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}; nodes are {[n.name for n in self.nodes]}")
