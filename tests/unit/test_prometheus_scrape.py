"""Debian's real `prometheus` scrapes a real trainer metrics endpoint, discovered through
hack/k8s_http_sd.py from worker pods built by the operator's own pod builder (their IP set to
127.0.0.1): the README's scrape config keeps exactly the metrics ports, the series keep
`dtjob`/`namespace` next to Prometheus's `job`/`instance` (no `exported_*`), and every
non-federated dashboard query returns data. No cluster: tests/e2e/test_prometheus.py does the
same against real pods."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from disttrain_api import metric_names as names
from disttrain_api import model as api
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext
from disttrain_trainer.telemetry.step_metrics import Metrics, observe_single_step

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))
import dashboard  # noqa: E402
import k8s_http_sd  # noqa: E402
from ports import free_port  # noqa: E402 - tests/ports.py: each xdist worker's own slice

SCRAPE_JOB = "disttrain-workers"  # the job_name of the README's scrape config


# Forecast inputs as a data-parallel rank 0 publishes them: 2 ranks waiting on the link 30% of a step
# (the forecast gauges appear with the first).
FORECAST_INPUTS = json.loads((Path(__file__).parents[1] / "forecast_inputs.json").read_text())


def worker_pods(ports: list[int]) -> list[dict[str, Any]]:
    """The operator's two worker pods of job `digits` in `ml`, as the API server would show them
    once running (rank r's metrics port is `ports[r]` so both fit on 127.0.0.1)."""
    pods = []
    for rank in range(2):
        spec = api.parse_spec({"mode": "data", "workers": {"replicas": 2}, "metrics": {"port": ports[rank]}})
        pod = build_children(spec, BuildContext(name="digits", namespace="ml", image="img", replicas=2)).pods[rank]
        pod["status"] = {"phase": "Running", "podIP": "127.0.0.1",
                         "conditions": [{"type": "Ready", "status": "True"}]}
        pods.append(pod)
    return pods


def test_a_client_that_hangs_up_before_the_answer_costs_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """Prometheus closes an SD request its refresh timeout ended (pods listed slowly on a busy host):
    the endpoint drops that answer quietly and serves the next request."""
    listed = threading.Event()

    def slow_pods() -> list[dict[str, Any]]:
        time.sleep(0.5)
        listed.set()
        return worker_pods([free_port(), free_port()])

    sd = k8s_http_sd.serve(slow_pods)
    try:
        for _ in range(3):
            listed.clear()
            with socket.create_connection(sd.server_address[:2], timeout=5) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.sendall(b"GET / HTTP/1.1\r\nHost: sd\r\n\r\n")
            assert listed.wait(5)  # (the socket is closed with a reset before the answer)
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{sd.server_address[1]}/", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read())
    finally:
        sd.shutdown()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


def test_targets_carry_the_pod_roles_meta_labels() -> None:
    pods = worker_pods([9400, 9401])
    groups = k8s_http_sd.pod_targets(pods)
    metrics = [g for g in groups if g["labels"].get("__meta_kubernetes_pod_container_port_name") == "metrics"]
    assert sorted(g["targets"][0] for g in metrics) == ["127.0.0.1:9400", "127.0.0.1:9401"]
    labels = metrics[0]["labels"]
    assert labels["__meta_kubernetes_namespace"] == "ml"
    assert labels["__meta_kubernetes_pod_label_disttrain_dev_job_name"] == "digits"
    assert labels["__meta_kubernetes_pod_label_disttrain_dev_restart_attempt"] == "0"
    assert labels["__meta_kubernetes_pod_name"].startswith("digits-worker-")
    # Every declared port is a target (the dist port too); relabelling picks the metrics one.
    assert len(groups) == sum(len(p["spec"]["containers"][0]["ports"]) for p in pods)
    pending = {**pods[0], "status": {"phase": "Pending"}}
    assert k8s_http_sd.pod_targets([pending]) == []


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: Any) -> Any:
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:  # noqa: S310
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.get("/api/v1/query", query=expr)
        assert body["status"] == "success", f"{expr}\n-> {body.get('error')}"
        return body["data"]["result"]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: `make unit-prereqs` installs Debian's prometheus package"
    tmp = tmp_path_factory.mktemp("prom")
    ports = [free_port(), free_port()]
    ranks = [Metrics(job="digits", rank=r, mode="data", port=ports[r], run_dir=None, namespace="ml",
                     target_steps=100_000) for r in (0, 1)]  # fmt: skip
    stop = threading.Event()

    def train() -> None:  # steps keep coming, so rates have something to show
        step = 0
        while not stop.wait(0.05):
            step += 1
            for m in ranks:
                observe_single_step(m, step=step, loss=2.0 / step, lr=0.1, samples=64, t0=0.0,
                                                    t1=0.01, t2=0.04, end=0.05, comm_s=0.01, comm_bytes=1)
            if step % 20 == 0:
                ranks[0].observe_checkpoint(step, 0.2, 1000)

    # Rank 0 after its first steady interval: its forecast inputs, and the forecast gauges on them.
    ranks[0].observe_forecast(FORECAST_INPUTS)
    threading.Thread(target=train, daemon=True).start()
    sd = k8s_http_sd.serve(lambda: worker_pods(ports))
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [k8s_http_sd.documented_scrape_job(f"http://127.0.0.1:{sd.server_address[1]}/", "1s")],
    }))
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=fh, stderr=subprocess.STDOUT)
    prom = Prom(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 45
        while True:  # both ranks scraped at least 4 times: rate() over 30s has points
            try:
                got = prom.query(f'count_over_time({names.STEP}{{{names.LABEL_JOB}="digits"}}[30s])')
                if len(got) == 2 and all(float(s["value"][1]) >= 4 for s in got):
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        yield prom
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
        sd.shutdown()
        for m in ranks:
            m.close()


def test_relabelling_keeps_the_metrics_ports_and_our_labels(scraped: Prom) -> None:
    active = scraped.get("/api/v1/targets", state="active")["data"]["activeTargets"]
    assert sorted(t["labels"]["pod"] for t in active) == ["digits-worker-0", "digits-worker-1"]
    assert all(t["health"] == "up" and t["labels"]["job"] == SCRAPE_JOB for t in active), active
    (series,) = scraped.query(f'{names.STEP}{{{names.LABEL_JOB}="digits", {names.LABEL_RANK}="0"}}')
    labels = series["metric"]
    assert labels[names.LABEL_NAMESPACE] == "ml" and labels["job"] == SCRAPE_JOB and labels[names.LABEL_RESTART_ATTEMPT] == "0"
    assert not [k for k in labels if k.startswith("exported_")], labels


def test_every_dashboard_query_returns_data(scraped: Prom) -> None:
    dash = dashboard.load()
    federated = (names.FED_ROUND, names.FED_CLIENTS_ANSWERED + "_total")
    for title, expr in dashboard.queries(dash, namespace="ml", job="digits", rate_interval="30s", range_="5m"):
        result = scraped.query(expr)  # valid PromQL, or query() fails
        if not any(f in expr for f in federated):
            assert result, f"{title!r} returned no data:\n{expr}"
    # The communication fraction panel: comm 0.01 s of every 0.05 s step.
    (_, frac_expr), = [(t, e) for t, e in dashboard.queries(dash, namespace="ml", job="digits", rate_interval="30s")
                       if t.startswith("Communication fraction")]
    (sample,) = scraped.query(frac_expr)
    assert float(sample["value"][1]) == pytest.approx(0.2, rel=1e-6)
