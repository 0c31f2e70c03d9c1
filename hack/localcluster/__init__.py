"""The project's own multi-node Kubernetes on one machine (see DESIGN.md § Local cluster)."""

from __future__ import annotations

from .cluster import ContainerGone, LocalCluster
from .config import ClusterConfig, NodeConfig
from .proc import ClusterError

__all__ = ["ClusterConfig", "ClusterError", "ContainerGone", "LocalCluster", "NodeConfig"]
