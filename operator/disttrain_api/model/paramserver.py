"""spec.paramServer: the parameter server's shards and staleness bound."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import fld
from .vocabulary import DNS_LABEL_PATTERN


@dataclass(frozen=True, kw_only=True)
class ParamServerSpec:
    max_staleness: int = fld(
        4, minimum=0,
        desc="A pushed gradient computed on parameters more than this many updates behind its shard's "
        "is rejected (the worker pulls and goes on); within the bound the step is lr / max(1, staleness).",
    )
    shards: int = fld(
        1, minimum=1, maximum=64,
        desc="Server replicas; parameters are split over them by tensor (largest first onto the least "
        "loaded), so no single server carries all the traffic.",
    )
    port: int = fld(50052, minimum=1, maximum=65535, desc="Parameter-server gRPC port (every shard).")
    tls: bool = fld(True, desc="TLS on the parameter-server channels in the cluster; workers verify the servers against the CA.")
    tls_secret_name: str | None = fld(
        None, pattern=DNS_LABEL_PATTERN,
        desc="Secret (ca.crt, tls.crt, tls.key) for the servers, valid for every shard's Service name; unset: "
        "the operator creates a self-signed CA and server certificate.",
    )
