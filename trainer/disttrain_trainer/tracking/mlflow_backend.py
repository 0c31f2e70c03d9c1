"""The job's MLflow run: the spec as parameters, the tracked scalars with their steps, the summary
(summary.json and its numbers) and the exported model (artifact folder `model`).

The client is mlflow-skinny's `MlflowClient` (no server, no ML libraries), imported on the
backend's thread at its first call so the trainer never waits for it. Every call is tried
ATTEMPTS times, each bounded by spec.tracking.mlflow.timeoutSeconds (the client's own retries
are turned off: this module's are the bound); once a call failed for good the next ones are tried
once until one succeeds, so a server that is down costs the end of the run at most one timeout
per record batch. The run's id is kept in <checkpoint dir>/tracking/mlflow-run.json: a gang that
restarts logs on into the same run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from disttrain_api.model import MlflowSpec

from .background import Final, Scalars
from .scalars import summary_scalars

ATTEMPTS = 3
BACKOFF_S = (0.5, 1.0)
# The REST API's limits on one log-batch request.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE = 6000
RUN_FILE = "mlflow-run.json"
MODEL_ARTIFACT_PATH = "model"
T = TypeVar("T")


def client_environment(spec: MlflowSpec) -> dict[str, str]:
    """The client's settings, as environment variables (how mlflow reads them): one request is
    bounded by the spec's timeout, and only this module retries."""
    return {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(spec.timeout_seconds), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


class MlflowBackend:
    name = "mlflow"

    def __init__(self, spec: MlflowSpec, *, experiment: str, run_name: str, params: dict[str, str],
                 tags: dict[str, str], state_dir: Path) -> None:  # fmt: skip
        self.spec, self.experiment, self.run_name = spec, experiment, run_name
        self.params, self.tags, self.state_dir = params, tags, state_dir
        self._client: Any = None
        self.run_id: str | None = None
        self._degraded = False  # a call failed for good: try once until one succeeds

    # ------------------------------------------------------------------ calls

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        attempts = 1 if self._degraded else ATTEMPTS
        for i in range(attempts):
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 - the client raises MlflowException and requests' errors alike
                if i + 1 >= attempts:
                    self._degraded = True
                    raise RuntimeError(f"{what} at {self.spec.uri}: {type(e).__name__}: {e}") from e
                time.sleep(BACKOFF_S[min(i, len(BACKOFF_S) - 1)])
            else:
                self._degraded = False
                return out
        raise AssertionError("unreachable")

    def _ensure_run(self) -> str:
        if self.run_id is not None:
            return self.run_id
        if self._client is None:
            from mlflow.tracking import MlflowClient  # noqa: PLC0415 - mlflow (seconds to import)

            self._client = MlflowClient(tracking_uri=self.spec.uri)
        c = self._client
        run_id = self._call("resume the run", self._resumed_run)
        if run_id is None:
            exp = self._call("find or create the experiment", self._experiment_id)
            run = self._call("create the run", lambda: c.create_run(exp, run_name=self.run_name, tags=self.tags))
            run_id = run.info.run_id
            self._remember(run_id)
        self._log_params(run_id)
        self.run_id = run_id
        return run_id

    def _resumed_run(self) -> str | None:
        """The run an earlier attempt of this job created on this server and experiment, if it is there."""
        try:
            saved = json.loads((self.state_dir / RUN_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(saved, dict) or saved.get("uri") != self.spec.uri or saved.get("experiment") != self.experiment:
            return None
        run_id = str(saved.get("runId"))
        from mlflow.exceptions import MlflowException  # noqa: PLC0415 - mlflow (seconds to import)

        try:
            self._client.get_run(run_id)
        except MlflowException as e:
            if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        self._client.update_run(run_id, status="RUNNING")
        return run_id

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException  # noqa: PLC0415 - mlflow (seconds to import)

        c = self._client
        found = c.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return c.create_experiment(self.experiment)
        except MlflowException:  # another job created it meanwhile
            found = c.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _remember(self, run_id: str) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps({"runId": run_id, "uri": self.spec.uri, "experiment": self.experiment}))
        os.replace(tmp, self.state_dir / RUN_FILE)

    def _log_params(self, run_id: str) -> None:
        from mlflow.entities import Param  # noqa: PLC0415 - mlflow (seconds to import)

        items = [Param(k, v[:MAX_PARAM_VALUE]) for k, v in sorted(self.params.items())]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            chunk = items[i : i + MAX_PARAMS_PER_BATCH]
            self._call("log the parameters", lambda chunk=chunk: self._client.log_batch(run_id, params=chunk))

    # ------------------------------------------------------------------ Backend

    def write(self, items: list[Scalars]) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415 - mlflow (seconds to import)

        run_id = self._ensure_run()
        metrics = [Metric(tag, value, int(item.wall_time * 1000), item.step)
                   for item in items for tag, value in item.values.items()]  # fmt: skip
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            chunk = metrics[i : i + MAX_METRICS_PER_BATCH]
            self._call("log the metrics", lambda chunk=chunk: self._client.log_batch(run_id, metrics=chunk))

    def finish(self, final: Final) -> None:
        """Each part is tried on its own: a summary that could not be logged still ends the run."""
        if final.summary is None and self.run_id is None:
            return  # nothing was logged: no run to close
        run_id = self._ensure_run()
        c = self._client
        parts: list[tuple[str, Callable[[], Any]]] = []
        if (summary := final.summary) is not None:
            parts.append(("summary metrics", lambda: self.write(
                [Scalars(step=final.step, values=summary_scalars(summary), wall_time=time.time())])))
            parts.append(("summary", lambda: self._call("log the summary", lambda: c.log_dict(run_id, summary, "summary.json"))))
            if (folder := final.export_dir) is not None:
                parts.append(("model", lambda: self._call(
                    "log the exported model", lambda: c.log_artifacts(run_id, folder, artifact_path=MODEL_ARTIFACT_PATH))))
        # A run that stopped without a summary is FAILED until a restarted gang resumes it (RUNNING).
        status = "FINISHED" if summary is not None else "FAILED"
        parts.append(("end", lambda: self._call("end the run", lambda: c.set_terminated(run_id, status=status))))
        failed = []
        for what, part in parts:
            try:
                part()
            except Exception as e:  # noqa: BLE001 - reported together below
                failed.append(f"{what}: {e}")
        if failed:
            raise RuntimeError("; ".join(failed))
