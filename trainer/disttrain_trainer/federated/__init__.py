"""Federated learning over gRPC (McMahan et al. 2017; Bonawitz et al. 2017).

`run(cfg)` plays the role DISTTRAIN_ROLE names: the aggregator (`aggregator`)
or a client process hosting several simulated clients (`client_process`).
"""

from __future__ import annotations

from .entry import run

__all__ = ["run"]
