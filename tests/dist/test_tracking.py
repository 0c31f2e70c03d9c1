"""spec.tracking through `disttrain local`: TensorBoard event files read back with TensorBoard's own
reader, and a real `mlflow server` (SQLite backend store, artifacts in a temp dir) holding the run:
from data-parallel rank 0, from the federated aggregator (rounds as steps), and from
parameter-server worker 0 (versions as steps) while its MLflow server hangs: training succeeds and
the undelivered records are counted."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.dist

TIME_TAGS = {"time/compute_seconds", "time/comm_exposed_seconds", "time/comm_busy_seconds", "time/data_seconds",
             "time/idle_seconds"}  # fmt: skip
TRAIN_TAGS = {"train/loss", "train/samples_per_second", *TIME_TAGS}


def run_local(tmp_path: Path, name: str, spec: str) -> Path:
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(f"apiVersion: disttrain.dev/v1alpha1\nkind: DistTrainJob\nmetadata: {{name: {name}}}\n"
                        f"spec:\n{spec}")  # fmt: skip
    run_dir = tmp_path / name
    p = subprocess.run([sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir", str(run_dir),
                        "--fresh", "--no-progress", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    logs = "".join(f.read_text()[-3000:] for f in sorted((run_dir / "logs").glob("*.log")))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:] + logs
    return run_dir


def scalars(run_dir: Path, job: str) -> dict[str, list[int]]:
    """tag -> its steps, as TensorBoard reads the job's event files."""
    ea = EventAccumulator(str(run_dir / "checkpoints" / job / "tensorboard"))
    ea.Reload()
    return {tag: [e.step for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def mlflow_run(server: Any, experiment: str) -> Any:
    client = server.client()
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    (run,) = client.search_runs([exp.experiment_id])
    return client, run


def test_data_parallel_rank0_writes_tensorboard_and_logs_its_run_to_mlflow(tmp_path: Path,
                                                                           mlflow_tracking_server: Any) -> None:  # fmt: skip
    run_dir = run_local(tmp_path, "track-data", f"""\
  mode: data
  workers: {{replicas: 2}}
  model: {{name: mlp, hidden: 32, layers: 1}}
  data: {{name: digits, batchSize: 64}}
  training: {{steps: 40, logIntervalSteps: 10, evalIntervalSteps: 20}}
  checkpoint: {{intervalSteps: 20}}
  tracking: {{tensorboard: true, mlflow: {{uri: "{mlflow_tracking_server.url}", experiment: dist-data}}}}
""")
    tags = scalars(run_dir, "track-data")
    for tag in TRAIN_TAGS | {"train/learning_rate"}:
        assert tags[tag] == [10, 20, 30, 40], tag
    assert tags["eval/test_accuracy"] == [20, 40]  # the periodic one and the final one
    assert tags["checkpoint/write_seconds"] == [20, 40]
    assert tags["summary/finalLoss"] == [40]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = jsonl(run_dir / "metrics-rank0.jsonl")
    assert not any(r.get("event") == "tracking_errors" for r in steps)

    client, run = mlflow_run(mlflow_tracking_server, "dist-data")
    assert run.info.run_name == "track-data" and run.info.status == "FINISHED"
    p = run.data.params
    assert p["training.steps"] == "40" and p["workers.replicas"] == "2" and p["mode"] == "data"
    assert p["model.hidden"] == "32" and p["job"] == "track-data"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    logged = {r["step"]: r["loss"] for r in steps if "event" not in r}
    assert {m.step: m.value for m in history} == pytest.approx(logged)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "time/comm_exposed_seconds")] == [10, 20, 30, 40]
    assert run.data.metrics["summary/testAccuracy"] == pytest.approx(summary["testAccuracy"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"summary.json", "model"}
    model = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id, "model")}
    export = Path(summary["export"]["path"])
    assert model == {f"model/{f.name}": f.stat().st_size for f in export.iterdir()}
    logged_summary = json.loads(Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))).read_text())
    assert logged_summary["finalLoss"] == summary["finalLoss"]


def test_the_federated_aggregator_tracks_rounds_as_steps(tmp_path: Path, mlflow_tracking_server: Any) -> None:
    run_dir = run_local(tmp_path, "track-fed", f"""\
  mode: federated
  workers: {{replicas: 2}}
  model: {{name: mlp, hidden: 32, layers: 1}}
  data: {{name: digits, batchSize: 32}}
  optimizer: {{name: sgd, lr: 0.05, scaleLR: none, decay: none}}
  federated: {{clients: 4, clientsPerRound: 2, rounds: 4, roundTimeoutSeconds: 30, partition: {{kind: iid}}}}
  tracking: {{tensorboard: true, mlflow: {{uri: "{mlflow_tracking_server.url}", experiment: dist-fed}}}}
""")
    tags = scalars(run_dir, "track-fed")
    for tag in TRAIN_TAGS | {"eval/test_accuracy", "federated/clients_answered", "federated/bytes_up"}:
        assert tags[tag] == [1, 2, 3, 4], tag
    client, run = mlflow_run(mlflow_tracking_server, "dist-fed")
    assert run.info.status == "FINISHED" and run.data.params["federated.rounds"] == "4"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/test_accuracy")] == [1, 2, 3, 4]
    assert "model" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.fixture
def hung_server() -> Iterator[str]:
    """A tracking "server" that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_paramserver_worker0_tracks_versions_and_a_hung_mlflow_server_costs_only_counted_errors(
        tmp_path: Path, hung_server: str) -> None:  # fmt: skip
    run_dir = run_local(tmp_path, "track-ps", f"""\
  mode: paramserver
  workers: {{replicas: 2}}
  model: {{name: mlp, hidden: 32, layers: 1}}
  data: {{name: digits, batchSize: 64}}
  optimizer: {{name: sgd, lr: 0.05, scaleLR: none, decay: none}}
  training: {{steps: 30, logIntervalSteps: 10, evalIntervalSteps: 20}}
  checkpoint: {{intervalSteps: 20}}
  tracking: {{tensorboard: true, mlflow: {{uri: "{hung_server}", timeoutSeconds: 1}}}}
""")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["testAccuracy"] > 0
    records = jsonl(run_dir / "metrics-rank0.jsonl")
    versions = [r["version"] for r in records if "event" not in r]
    assert len(versions) == 3 and versions == sorted(versions) and versions[-1] >= 30
    tags = scalars(run_dir, "track-ps")
    assert tags["train/loss"] == versions and set(TRAIN_TAGS) <= set(tags)
    assert len(tags["eval/test_accuracy"]) == 2  # after iteration 20, and the final one
    (errors,) = [r for r in records if r.get("event") == "tracking_errors"]
    assert errors["mlflow"] > 0 and errors.get("tensorboard", 0) == 0
