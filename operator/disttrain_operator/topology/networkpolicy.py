"""Who may connect to a job's pods: networking.k8s.io/v1 NetworkPolicies, one per side.

- the gang (workers, or federated clients): anything from the job's own pods (the
  torch.distributed rendezvous port and the ports gloo/NCCL open between ranks, which
  are not known in advance), and the metrics ports from anywhere;
- the servers (the federated aggregator, each parameter-server shard): their gRPC
  port from the job's gang pods only, and the metrics port from anywhere.

The metrics ports stay open to every source so that Prometheus and the operator's
progress scrape reach them wherever they run; they serve read-only counters, never a
model or data. A pod selector without a namespace selector matches pods of the job's
own namespace only, so no pod of another namespace reaches the rendezvous or a
server. Policies only add up: a user who adds ports to the pods (a sidecar) adds a
policy of their own. Enforced only where the cluster's CNI implements NetworkPolicy
(README, "Threat model").
"""

from __future__ import annotations

from typing import Any

from disttrain_api import constants as c
from disttrain_api.model import JobSpec

from .common import BuildContext, metadata, minted_name

API_VERSION = "networking.k8s.io/v1"


def metrics_ports(spec: JobSpec) -> list[int]:
    """Rank r of a pod serves on metrics.port + its local rank."""
    return [spec.metrics.port + i for i in range(spec.workers.procs_per_worker)]


def _ports(ports: list[int]) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def _policy(ctx: BuildContext, purpose: str, selector: dict[str, str], ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": metadata(ctx, minted_name(ctx, purpose), {c.LABEL_JOB: ctx.name}),
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def build_gang_policy(spec: JobSpec, ctx: BuildContext, gang_role: str) -> dict[str, Any]:
    job_pods = {"podSelector": {"matchLabels": {c.LABEL_JOB: ctx.name}}}
    return _policy(ctx, "gang", {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: gang_role},
                   [{"from": [job_pods]}, {"ports": _ports(metrics_ports(spec))}])  # fmt: skip


def build_server_policy(spec: JobSpec, ctx: BuildContext, *, server_role: str, gang_role: str,
                        port: int) -> dict[str, Any]:  # fmt: skip
    gang = {"podSelector": {"matchLabels": {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: gang_role}}}
    return _policy(ctx, server_role, {c.LABEL_JOB: ctx.name, c.LABEL_ROLE: server_role},
                   [{"from": [gang], "ports": _ports([port])}, {"ports": _ports([spec.metrics.port])}])  # fmt: skip
