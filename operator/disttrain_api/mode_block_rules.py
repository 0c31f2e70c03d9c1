"""Cross-field rules of the mode blocks: spec.federated and spec.paramServer only in their mode,
federated sampling, secure aggregation, Byzantine-robust strategies, central differential
privacy and the clients' credentials."""

from __future__ import annotations

from .model import ROBUST_STRATEGIES, FederatedSpec, JobSpec
from .rule_checker import Checker


def mode_blocks(spec: JobSpec, c: Checker) -> None:
    if not c.ok("spec.mode"):
        return
    if spec.federated is not None and spec.mode != "federated":
        c.add("spec.federated", f"only allowed in mode federated (mode is {spec.mode}); remove it or set spec.mode: federated")
    if spec.param_server is not None and spec.mode != "paramserver":
        c.add(
            "spec.paramServer",
            f"only allowed in mode paramserver (mode is {spec.mode}); remove it or set spec.mode: paramserver",
        )
    if spec.mode == "paramserver" and c.ok("spec.workers.procsPerWorker") and spec.workers.procs_per_worker != 1:
        # Each worker is one process that talks to the servers on its own; there is nothing to share in a pod.
        c.add(
            "spec.workers.procsPerWorker",
            f"must be 1 in mode paramserver (got {spec.workers.procs_per_worker}); raise workers.replicas instead",
        )
    fed = spec.federated
    if fed is not None and c.ok("spec.federated.clients", "spec.federated.clientsPerRound"):
        if fed.clients_per_round > fed.clients:
            c.add(
                "spec.federated.clientsPerRound",
                f"{fed.clients_per_round} must be <= federated.clients {fed.clients}",
            )
    if fed is not None and c.ok("spec.federated.minAnsweredClients", "spec.federated.clientsPerRound"):
        if fed.min_answered_clients > fed.clients_per_round:
            c.add(
                "spec.federated.minAnsweredClients",
                f"{fed.min_answered_clients} must be <= federated.clientsPerRound {fed.clients_per_round}",
            )
    if fed is not None and fed.secure_aggregation and c.ok("spec.federated.secureAggregation"):
        if fed.compression != "none" and c.ok("spec.federated.compression"):
            c.add(
                "spec.federated.compression",
                f"{fed.compression} cannot be combined with secureAggregation: masked sums need dense "
                "fixed-point updates; set compression: none",
            )
        # Bonawitz et al.: the masks of a dropped client are recovered from t shares, and with
        # fewer than 2 clients answering the "sum" would be one client's update in the clear.
        if c.ok("spec.federated.minAnsweredClients") and fed.min_answered_clients < 2:
            c.add(
                "spec.federated.minAnsweredClients",
                f"{fed.min_answered_clients} must be >= 2 with secureAggregation (a sum of one update reveals it)",
            )
    if fed is not None:
        _fed_robust(fed, c)
        _fed_privacy(fed, c)


def _fed_robust(fed: FederatedSpec, c: Checker) -> None:
    """Byzantine-robust rules: they need every update in the clear and enough of them."""
    if not c.ok("spec.federated.strategy") or fed.strategy not in ROBUST_STRATEGIES:
        return
    if fed.secure_aggregation and c.ok("spec.federated.secureAggregation"):
        c.add("spec.federated.strategy",
              f"{fed.strategy} needs each client's update, which secureAggregation hides (the aggregator "
              "sees only the sum): use fedavg, fedprox or fedadam with secureAggregation, or turn it off")
    answered = fed.min_answered_clients
    if fed.strategy == "trimmedMean" and c.ok("spec.federated.trimFraction", "spec.federated.clientsPerRound"):
        if fed.trim_fraction >= 0.5:
            c.add("spec.federated.trimFraction", f"{fed.trim_fraction} must be < 0.5 (it is cut at each end)")
        elif int(fed.trim_fraction * fed.clients_per_round) < 1:
            c.add("spec.federated.trimFraction",
                  f"{fed.trim_fraction} trims nothing from clientsPerRound {fed.clients_per_round} updates "
                  f"(floor({fed.trim_fraction} x {fed.clients_per_round}) = 0); raise it to at least "
                  f"{1 / fed.clients_per_round:.3g}, or use fedavg")
    if fed.strategy in ("krum", "multiKrum") and c.ok("spec.federated.byzantineClients",
                                                       "spec.federated.minAnsweredClients"):
        f = fed.byzantine_clients
        # Blanchard et al. 2017: Krum tolerates f of n only when n > 2f + 2.
        if answered < 2 * f + 3:
            c.add("spec.federated.minAnsweredClients",
                  f"{answered} must be >= 2 x byzantineClients + 3 = {2 * f + 3} with {fed.strategy} "
                  "(Krum tolerates f hostile clients of n only when n > 2f + 2)")
        m = fed.multi_krum_selected
        if fed.strategy == "multiKrum" and m is not None and c.ok("spec.federated.multiKrumSelected"):
            if m > answered - f:
                c.add("spec.federated.multiKrumSelected",
                      f"{m} must be <= minAnsweredClients - byzantineClients = {answered - f}: a round may "
                      f"close with {answered} updates, up to {f} of them hostile")


def _fed_privacy(fed: FederatedSpec, c: Checker) -> None:
    dp = fed.privacy
    if dp is None or not c.ok("spec.federated.privacy"):
        return
    if fed.secure_aggregation and c.ok("spec.federated.secureAggregation"):
        c.add("spec.federated.privacy",
              "central differential privacy clips each update at the aggregator, which secureAggregation "
              "hides; turn one of them off")
    if c.ok("spec.federated.strategy") and fed.strategy in ROBUST_STRATEGIES:
        c.add("spec.federated.privacy",
              f"the noise is calibrated to a mean of clipped updates; strategy {fed.strategy} is not one "
              "(use fedavg, fedprox or fedadam with privacy)")
    if c.ok("spec.federated.privacy.delta", "spec.federated.clients") and dp.delta >= 1 / fed.clients:
        # A delta of 1/N lets the mechanism expose one of N clients' data outright with that chance.
        c.add("spec.federated.privacy.delta",
              f"{dp.delta:g} must be < 1 / clients = {1 / fed.clients:.3g} (smaller is usual, e.g. 1e-5)")


def channel_security(spec: JobSpec, c: Checker) -> None:
    fed = spec.federated
    if fed is not None and fed.token_secret_name and c.ok("spec.federated.tokenSecretName"):
        # Every client pod would mount the one key and could mint a token for any client id.
        c.add(
            "spec.federated.tokenSecretName",
            "is not supported: a token key shared by every client pod lets any of them speak for any "
            "client; remove it: the operator mints one credential per client and mounts each pod only its own",
        )
