"""spec.federated: rounds, client sampling, strategies (robust ones included), compression, secure
aggregation and central differential privacy."""

from __future__ import annotations

from dataclasses import dataclass

from ..dataparse import fld
from .vocabulary import DNS_LABEL_PATTERN, FedCompression, FedPartitionKind, FedStrategy


@dataclass(frozen=True, kw_only=True)
class FedPartition:
    kind: FedPartitionKind = fld("dirichlet", desc="iid or dirichlet (label-skewed, non-IID) split over clients.")
    alpha: float = fld(0.5, minimum=0.0, exclusive_minimum=True, desc="Dirichlet concentration (smaller = more skew).")


@dataclass(frozen=True, kw_only=True)
class FedPrivacy:
    """Central differential privacy at the aggregator (DP-FedAvg, McMahan et al. 2018)."""

    clip_norm: float = fld(
        minimum=0.0, exclusive_minimum=True,
        desc="Each client's update is scaled down to at most this L2 norm before it is summed.",
    )
    noise_multiplier: float = fld(
        minimum=0.0, exclusive_minimum=True,
        desc="Gaussian noise on the sum of clipped updates has standard deviation noiseMultiplier x "
        "clipNorm; the sum is then divided by clientsPerRound.",
    )
    delta: float = fld(
        1e-5, minimum=0.0, maximum=1.0, exclusive_minimum=True,
        desc="The delta of the (epsilon, delta) budget reported each round (must be < 1 / clients).",
    )


@dataclass(frozen=True, kw_only=True)
class FederatedSpec:
    clients: int = fld(10, minimum=1, desc="Simulated clients, spread over the worker pods.")
    clients_per_round: int = fld(
        5, minimum=1,
        desc="Clients sampled per round, from all clients (<= clients); with privacy the expected "
        "number: each client is sampled with probability clientsPerRound / clients.",
    )
    min_answered_clients: int = fld(
        2, minimum=1,
        desc="A round aggregates only when at least this many sampled clients answered in time; "
        "otherwise it is retried with a new sample (<= clientsPerRound). With privacy every round "
        "is published, however many answered.",
    )
    rounds: int = fld(30, minimum=1, desc="Federated rounds.")
    local_epochs: int = fld(1, minimum=1, desc="Local epochs per client per round.")
    strategy: FedStrategy = fld(
        "fedavg", desc="fedavg (sample-weighted mean), fedprox (proximal term on the clients), "
        "fedadam (Adam on the server over the mean update), or a Byzantine-robust rule over the "
        "individual updates (not with secureAggregation): fedmedian (coordinate-wise median), "
        "trimmedMean (coordinate-wise, trimFraction cut at each end), krum (the update closest to "
        "its n - byzantineClients - 2 nearest others) or multiKrum (mean of the multiKrumSelected best by "
        "that score).",
    )
    trim_fraction: float = fld(
        0.1, minimum=0.0, maximum=0.5,
        desc="trimmedMean: the fraction of updates cut at each end of every coordinate (< 0.5).",
    )
    byzantine_clients: int = fld(
        1, minimum=0,
        desc="krum / multiKrum: how many hostile clients a round must tolerate (f); needs "
        "minAnsweredClients >= 2f + 3.",
    )
    multi_krum_selected: int | None = fld(
        None, minimum=1,
        desc="multiKrum: how many of the best-scored updates are averaged (m); unset: n - f of the n answered.",
    )
    privacy: FedPrivacy | None = fld(
        None, desc="Central differential privacy: clip each update, add Gaussian noise to the sum; "
        "the spent budget (epsilon at delta) is in every round record and the summary.",
    )
    proximal_mu: float = fld(0.01, minimum=0.0, desc="FedProx proximal term.")
    server_learning_rate: float = fld(
        1.0, minimum=0.0, exclusive_minimum=True,
        desc="Server step on the mean update: fedavg/fedprox move by lr x mean (1.0 = plain "
        "averaging); fedadam uses it as Adam's step size (0.01-0.1 is typical).",
    )
    compression: FedCompression = fld("none", desc="Update compression: none, int8 or topk.")
    topk_ratio: float = fld(0.01, minimum=0.0, maximum=1.0, exclusive_minimum=True, desc="Kept fraction with topk.")
    secure_aggregation: bool = fld(False, desc="Pairwise-masked updates: the aggregator sees only the sum.")
    round_timeout_seconds: int = fld(60, minimum=1, desc="Close a round after this long with the updates received.")
    max_update_norm: float = fld(
        1000.0, minimum=0.0, exclusive_minimum=True,
        desc="Updates above this L2 norm are rejected; with secureAggregation clients clip to it and a "
        "round whose mean update is above it is abandoned; with privacy clipNorm bounds updates instead.",
    )
    port: int = fld(50051, minimum=1, maximum=65535, desc="Aggregator gRPC port.")
    partition: FedPartition = fld(factory=FedPartition, desc="How the data is split over clients.")
    tls: bool = fld(True, desc="TLS on the aggregator channel in the cluster; clients verify the server against the CA.")
    tls_secret_name: str | None = fld(
        None, pattern=DNS_LABEL_PATTERN,
        desc="Secret (ca.crt, tls.crt, tls.key) for the aggregator; unset: the operator creates a "
        "self-signed CA and server certificate.",
    )
    token_secret_name: str | None = fld(
        None, pattern=DNS_LABEL_PATTERN,
        desc="Not supported: one shared token key would let every client pod speak for every client. "
        "The operator mints one credential per client and mounts each pod only its own; leave unset.",
    )
