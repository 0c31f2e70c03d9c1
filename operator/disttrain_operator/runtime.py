"""Run the operator in this process until kopf stops: the handlers configured, logging, the
Kubernetes client, the operator's own /metrics and, when asked for, the leader lease.

`disttrain operator` (disttrain_cli) parses the flags into OperatorSettings and calls `run`.
"""

from __future__ import annotations

import logging
import os

import kopf
import prometheus_client
from disttrain_api import exitcodes

from . import handlers, kube, leader, settings


def run(cfg: settings.OperatorSettings, *, verbose: bool = False) -> int:
    handlers.configure(cfg)
    kopf.configure(verbose=verbose)
    logging.getLogger("disttrain.operator").setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:
        # kopf logs every handled event at INFO; our reconciler logs each transition itself.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kube.load_config()
    if cfg.metrics_port:
        prometheus_client.start_http_server(cfg.metrics_port)
    if cfg.leader_elect:
        elector = leader.Elector(kube.Kube(), leader.LeaseConfig(
            namespace=cfg.lease_namespace or settings.own_namespace(), identity=leader.default_identity()))
        standby = leader.serve_standby_health(cfg.liveness) if cfg.liveness else None
        elector.acquire()
        # Renewing and the watchdog start at once: the lease's clock runs from acquire().
        # Lost (not renewed in time): the process ends, reconcile threads mid-write included,
        # before a standby may take over; the Deployment restarts this replica as a standby.
        elector.keep(lost=lambda: os._exit(exitcodes.LEASE_LOST))
        if standby is not None:
            standby.shutdown()
            standby.server_close()
    kopf.run(
        standalone=True,
        clusterwide=cfg.all_namespaces,
        namespaces=cfg.watch_namespaces(),
        liveness_endpoint=cfg.liveness or None,
    )
    return 0
