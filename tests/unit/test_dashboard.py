"""The Grafana dashboard (charts/disttrain/dashboards/disttrain.json): every query is valid
PromQL (promtool, offline), selects by the labels the trainer really exports (dtjob,
namespace; never Prometheus's own job/instance), reads only series that exist, and the panels
cover what an operator of a training job looks at. That every query returns data from a real
Prometheus scraping a real job is tests/e2e/test_prometheus.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from disttrain_api import metric_names as names
from disttrain_trainer.telemetry.step_metrics import Metrics, observe_single_step
from prometheus_client import generate_latest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
import dashboard  # noqa: E402

DASH = dashboard.load()
QUERIES = dashboard.queries(DASH, namespace="ns1", job="job1")


# Forecast inputs as a data-parallel rank 0 publishes them: 2 ranks waiting on the link 30% of a step
# (the forecast gauges appear with the first).
FORECAST_INPUTS = json.loads((Path(__file__).parents[1] / "forecast_inputs.json").read_text())


def exported_series() -> set[str]:
    """Names of every series a trainer rank exposes, from a real registry after one step."""
    m = Metrics(job="job1", rank=0, mode="data", port=0, run_dir=None, namespace="ns1", target_steps=100)
    observe_single_step(m, step=1, loss=1.0, lr=0.1, samples=8, t0=0.0, t1=0.1, t2=0.3, end=0.4,
                                        comm_s=0.1, comm_bytes=10)
    m.observe_checkpoint(1, 0.5, 100)
    m.observe_forecast(FORECAST_INPUTS)
    text = generate_latest(m.registry).decode()
    m.close()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make unit-prereqs` installs Debian's prometheus"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"disttrain:dashboard:{i}", "expr": expr} for i, (_, expr) in enumerate(QUERIES)]}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(QUERIES)} rules found" in proc.stdout


def test_promtool_rejects_broken_promql(tmp_path: Path) -> None:
    # The check above can fail: promtool really parses the expressions.
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "x:y", "expr": "sum by (dtjob) (rate(disttrain_step_seconds_sum[1m]"}]}]}))
    proc = subprocess.run([shutil.which("promtool") or "promtool", "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0


@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[f"{i}-{t}" for i, (t, _) in enumerate(QUERIES)])
def test_query_selects_one_job_by_our_labels(title: str, expr: str) -> None:
    assert "$" not in expr, f"{title}: an unsubstituted Grafana variable"
    assert re.search(r'\bjob\s*(=|!=|=~|!~)', expr) is None and not re.search(r'\(\s*job\b|,\s*job\b', expr), (
        f"{title}: `job` is Prometheus's scrape job; the DistTrainJob is `{names.LABEL_JOB}`")
    selectors = re.findall(r"(disttrain_[a-z_]+)\{([^}]*)\}", expr)
    assert selectors, f"{title}: no disttrain series"
    for series, labels in selectors:
        assert f'{names.LABEL_JOB}=~"job1"' in labels and f'{names.LABEL_NAMESPACE}="ns1"' in labels, (title, series)


def test_queries_read_only_series_that_exist() -> None:
    known = exported_series() | {names.FED_ROUND, names.FED_CLIENTS_ANSWERED + "_total"}
    used = {s for _, expr in QUERIES for s in re.findall(r"\b(disttrain_[a-z_]+)\{", expr)}
    assert used <= known, f"not exported by the trainer: {sorted(used - known)}"
    for query in dashboard.variable_queries(DASH, namespace="ns1"):
        assert names.STEP in query


def test_restart_panel_uses_the_scrape_target_label() -> None:
    (expr,) = [e for t, e in QUERIES if "restarts" in t.lower()]
    assert f"by ({names.LABEL_JOB}, {names.LABEL_RESTART_ATTEMPT})" in expr


def test_panels_cover_the_story() -> None:
    titles = " | ".join(p["title"].lower() for p in dashboard.panels(DASH))
    for needed in ("step time", "samples / s", "where step time goes", "communication fraction", "loss",
                   "restarts", "checkpoint", "progress", "eta", "forecast scaling efficiency", "federated rounds",
                   "federated clients"):
        assert needed in titles, needed
    legends = " | ".join(t["legendFormat"] for p in dashboard.panels(DASH) for t in p["targets"])
    for part in ("compute", "communication", "data", "idle"):
        assert part in legends, part
