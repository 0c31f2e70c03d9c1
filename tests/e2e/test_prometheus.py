"""A real Prometheus (Debian's `prometheus`) scrapes the worker pods of a real job, with the
scrape config the chart's README documents.

Debian builds Prometheus without kubernetes_sd, so discovery goes through
hack/k8s_http_sd.py: an HTTP SD endpoint that lists the pods from the API server and serves
them with kubernetes_sd's pod-role meta labels; the README's relabel_configs apply unchanged.

- the series carry `dtjob`/`namespace` and Prometheus's own `job` (the scrape job) untouched:
  no `exported_job`, no `exported_namespace`;
- PromQL's communication fraction of rank 0 agrees with the trainer's own summary within 5%;
- every query of the Grafana dashboard is valid PromQL and returns data for the running job
  (the federated row only parses: a data-parallel job has no rounds).

Prometheus runs on the test host and scrapes pod IPs, which the local cluster routes to the
host (on kind, add a route to the pod network first).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from disttrain_api import metric_names as names

from .conftest import ROOT, Kubectl, OperatorProcess, digits_manifest  # type: ignore[import-not-found]

sys.path.insert(0, str(ROOT / "hack"))
import dashboard  # noqa: E402
import k8s_http_sd  # noqa: E402
from ports import free_port  # tests/ports.py: each xdist worker's own slice

pytestmark = pytest.mark.timeout(900)

SCRAPE_JOB = "disttrain-workers"  # the job_name of the README's scrape config
SCRAPE_INTERVAL_S = 2
# Tens of seconds of training: 4000 steps on pods held to 250m CPU take as long as 12000 at
# 750m, for a third of the CPU the suite's other tests share.
STEPS = 4000
WORKER_CPU = "250m"
WATCH_FROM_STEP = STEPS // 4  # well inside the run: the dashboard's rate() windows hold several scrapes


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:  # 400/422 carry the PromQL error as JSON
            return json.loads(e.read())

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = self.get("/api/v1/query", **params)
        assert body["status"] == "success", f"{expr}\n-> {body.get('errorType')}: {body.get('error')}"
        return body["data"]["result"]


@pytest.fixture
def prometheus(kubectl: Kubectl, namespace: str, tmp_path: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: `make cluster-prereqs` installs Debian's prometheus package"
    sd = k8s_http_sd.serve(k8s_http_sd.kubectl_pods(namespace, kubectl.kubeconfig))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": [k8s_http_sd.documented_scrape_job(f"http://127.0.0.1:{sd.server_address[1]}/")],
    }))
    check = subprocess.run([shutil.which("promtool") or "promtool", "check", "config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=fh, stderr=subprocess.STDOUT)
        try:
            prom = Prometheus(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=5) as resp:  # noqa: S310
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
            yield prom
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            sd.shutdown()
            print("prometheus log tail:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))


def test_prometheus_scrapes_workers_and_agrees_with_the_trainer(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, prometheus: Prometheus
) -> None:
    name = f"prom-{uuid.uuid4().hex[:5]}"
    # Long enough to be watched while it trains: the example's 400 steps take ~2 s on an idle
    # machine, less than one progress scrape, and the job could finish before step 100 was seen.
    obj = digits_manifest(name, namespace, training={"steps": STEPS, "evalIntervalSteps": STEPS // 4})
    obj["spec"]["workers"]["resources"]["cpu"] = WORKER_CPU
    kubectl.apply(obj)
    sel = f'{names.LABEL_JOB}="{name}", {names.LABEL_NAMESPACE}="{namespace}"'

    # 1. Both ranks become targets and are up, found through the API server's pod list.
    def targets_up() -> list[dict[str, Any]] | None:
        active = prometheus.get("/api/v1/targets", state="active")["data"]["activeTargets"]
        ours = [t for t in active if t["labels"].get("pod", "").startswith(f"{name}-worker-")]
        return ours if len(ours) == 2 and all(t["health"] == "up" for t in ours) else None

    targets = kubectl.wait_for("both worker pods scraped", targets_up, timeout=300)
    assert {t["labels"]["job"] for t in targets} == {SCRAPE_JOB}

    # 2. While the job trains: remember a moment well inside the run to evaluate the dashboard at
    #    (a quarter of the way: the 30 s rate() windows then hold samples of the training).
    def training() -> float | None:
        job = kubectl.job(namespace, name)
        status = job.get("status") or {}
        assert status.get("phase") not in ("Failed", "Succeeded"), f"the job ended before it was seen training: {status}"
        return time.time() if (status.get("step") or 0) >= WATCH_FROM_STEP and status.get("phase") == "Running" else None

    during = kubectl.wait_for(f"job Running past step {WATCH_FROM_STEP}", training, timeout=420)

    # status.progress while it trains: a rate and an ETA once two readings are written, and
    # kubectl's Progress and ETA columns.
    def progress_with_eta() -> dict[str, Any] | None:
        status = kubectl.job(namespace, name).get("status") or {}
        prog = status.get("progress") or {}
        return prog if prog.get("eta") and status.get("phase") == "Running" else None

    prog = kubectl.wait_for("status.progress with an ETA", progress_with_eta, timeout=60)
    assert prog["total"] == STEPS and prog["unit"] == "steps" and 0 < prog["percent"] < 100, prog
    assert prog["samplesPerSecond"] > 0 and prog["etaSeconds"] > 0, prog
    header = kubectl.run("get", "dtj", name, "-n", namespace).stdout.splitlines()[0].split()
    assert header[header.index("STEP") + 1 : header.index("STEP") + 3] == ["PROGRESS", "ETA"], header
    time.sleep(4 * SCRAPE_INTERVAL_S)  # samples on both sides of `during`

    # Our labels, and no collision with the target labels Prometheus adds.
    series = prometheus.query(f"{names.STEP}{{{sel}}}", at=during)
    assert sorted(s["metric"][names.LABEL_RANK] for s in series) == ["0", "1"], series
    for s in series:
        labels = s["metric"]
        assert labels["job"] == SCRAPE_JOB and labels["mode"] == "data", labels
        assert not [k for k in labels if k.startswith("exported_")], labels

    # 3. Every dashboard query is valid PromQL and returns data for this job.
    dash = dashboard.load()
    federated = (names.FED_ROUND, names.FED_CLIENTS_ANSWERED + "_total")
    for title, expr in dashboard.queries(dash, namespace=namespace, job=name, rate_interval="30s", range_="5m"):
        result = prometheus.query(expr, at=during)
        if any(f in expr for f in federated):
            continue  # parsed (query() asserts success); a data-parallel job has no rounds
        assert result, f"dashboard panel {title!r} returned no data:\n{expr}"
    for expr in dashboard.variable_queries(dash, namespace=namespace):
        # label_values(metric{...}, label) is Grafana's; Prometheus answers the series part.
        metric, label = expr[len("label_values("):-1].rsplit(",", 1)
        values = {s["metric"].get(label.strip()) for s in prometheus.query(metric, at=during)}
        assert (name if label.strip() == names.LABEL_JOB else namespace) in values, (expr, values)

    # 4. The run ends; PromQL's communication fraction of rank 0 over the whole run vs the
    #    trainer's summary (rank 0's own totals), within 5%.
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    summary = status["result"]["commFraction"]
    time.sleep(2 * SCRAPE_INTERVAL_S)
    rank0 = f'{sel}, {names.LABEL_RANK}="0"'
    (sample,) = prometheus.query(f"last_over_time({names.COMM_SECONDS_TOTAL}{{{rank0}}}[10m])"
                                 f" / last_over_time({names.STEP_SECONDS_SUM}{{{rank0}}}[10m])")
    promql = float(sample["value"][1])
    assert summary > 0 and abs(promql - summary) <= 0.05 * summary, (promql, summary)
    # kubectl's Comm column shows the same figure.
    assert status["commFraction"] == pytest.approx(summary, abs=1e-4)
    assert status["result"]["device"] == "cpu"
    assert "COMM" in kubectl.run("get", "dtj", name, "-n", namespace).stdout
    assert status["progress"]["percent"] == 100.0 and status["progress"]["eta"] == "0s", status["progress"]
