"""spec.tracking from the cluster's pods: a small data-parallel job logs to a real `mlflow server`
(SQLite backend store, artifacts in a temp dir) started on this machine at the nodes' bridge
address so pods reach it, and writes TensorBoard event files beside its checkpoints. The run holds
the spec as parameters, the metrics with their steps, the summary and the exported model; rank 0's
log says nothing went undelivered.

The server listens on the local cluster's bridge (hack/localcluster/config.py BRIDGE_IP): the
local cluster only.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import Kubectl, OperatorProcess, job_manifest  # type: ignore[import-not-found]

STEPS = 20


@pytest.fixture
def tracking_server(request: pytest.FixtureRequest, mlflow_servers: Any) -> Any:
    request.getfixturevalue("local_cluster")  # puts hack/ on sys.path; the bridge exists while it is up
    from localcluster.config import BRIDGE_IP  # type: ignore[import-not-found]

    return mlflow_servers(BRIDGE_IP)


def test_pods_log_the_job_to_an_mlflow_server(kubectl: Kubectl, operator: OperatorProcess, namespace: str,
                                              tracking_server: Any, tmp_path: Path) -> None:  # fmt: skip
    name = f"track-{uuid.uuid4().hex[:5]}"
    experiment = f"e2e-{name}"
    obj = job_manifest(name, namespace, steps=STEPS, training={"evalIntervalSteps": 10},
                       tracking={"tensorboard": True, "mlflow": {"uri": tracking_server.url, "experiment": experiment}})  # fmt: skip
    kubectl.apply(obj)
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    result = job["status"]["result"]
    log = kubectl.run("logs", "-n", namespace, f"{name}-worker-0").stdout
    assert "tracking (" not in log, log[-3000:]  # nothing undelivered, by either backend

    client = tracking_server.client()
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == name and run.info.status == "FINISHED"
    params = run.data.params
    assert params["workers.replicas"] == "2" and params["training.steps"] == str(STEPS)
    assert params["namespace"] == namespace and run.data.tags["disttrain.mode"] == "data"
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in loss] == [5, 10, 15, 20]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/test_accuracy")] == [10, 20]
    assert run.data.metrics["summary/testAccuracy"] == pytest.approx(result["testAccuracy"])
    logged = json.loads(Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))).read_text())
    assert logged["finalLoss"] == pytest.approx(result["finalLoss"]) and logged["export"] == result["export"]
    model = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id, "model")}
    assert model.keys() == {"model/model.safetensors", "model/model.json"}
    assert model["model/model.safetensors"] == result["export"]["bytes"]
