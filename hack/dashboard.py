"""The queries of the Grafana dashboard (charts/disttrain/dashboards/disttrain.json) as plain
PromQL, for the tests that check them: offline with promtool (unit tier) and against a real
Prometheus scraping a real job (e2e tier).

Grafana substitutes its variables before a query reaches Prometheus; `queries` does the same
with concrete values (a namespace, a job, the ranges).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "charts" / "disttrain" / "dashboards" / "disttrain.json"


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows flattened."""
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def queries(
    dash: dict[str, Any], *, namespace: str, job: str, rate_interval: str = "1m", range_: str = "1h"
) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, Grafana's variables replaced."""
    values = {
        "$namespace": namespace,
        "$dtjob": job,
        "$__rate_interval": rate_interval,
        "$__range": range_,
    }
    out = []
    for p in panels(dash):
        for t in p["targets"]:
            expr = t["expr"]
            # Longest names first: $__range must not eat into a longer variable's name.
            for var in sorted(values, key=len, reverse=True):
                expr = expr.replace(var, values[var])
            out.append((p["title"], expr))
    return out


def variable_queries(dash: dict[str, Any], *, namespace: str) -> list[str]:
    """The label_values(...) queries of the template variables (Grafana's own syntax)."""
    return [v["definition"].replace("$namespace", namespace) for v in dash["templating"]["list"]
            if v["type"] == "query"]
