"""One process's Prometheus registry, its optional /metrics server and its JSON-lines log.

The federated and parameter-server processes (aggregator, clients, server shards,
workers) each own one; the data/pipeline trainer keeps its own `metrics.Metrics`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class MetricsSink:
    """Registry, optional /metrics server and optional JSON-lines log of one process."""

    def __init__(self, *, labels: dict[str, str], port: int, log_path: Path | None):
        self.registry = CollectorRegistry()
        self.labels = labels
        self._server: Any = None
        if port:
            self._server, _ = start_http_server(port, registry=self.registry)
        self._log = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "a", buffering=1)  # noqa: SIM115

    def gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, tuple(self.labels), registry=self.registry).labels(**self.labels)

    def counter(self, name: str, doc: str) -> Any:
        return Counter(name, doc, tuple(self.labels), registry=self.registry).labels(**self.labels)

    def write(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps({**record, "time": time.time()}) + "\n")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
