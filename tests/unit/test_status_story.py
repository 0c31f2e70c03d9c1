"""What `kubectl get/describe dtj` tells about communication and devices (decide.py, no
cluster): status.commFraction from rank 0's scrape while running and from the summary when
done, the device in the Succeeded message, and a GPU pod without GPUs failing the job at once
with the trainer's reason."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from disttrain_api import exitcodes
from disttrain_api import metric_names as names
from disttrain_api import model as api
from disttrain_operator.decide import decide
from disttrain_operator.decision import Observed
from disttrain_operator.observe import PodView

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
SPEC = api.parse_spec({"mode": "data", "workers": {"replicas": 2}})
RUNNING = {"phase": "Running", "attempt": 0, "replicas": 2, "restarts": 0, "lastSpecReplicas": 2,
           "observedGeneration": 1, "startTime": "2026-01-01T11:59:00Z",
           "conditions": [{"type": "Running", "status": "True", "reason": "GangRunning"}]}


def pod(index: int, phase: str = "Running", **kw: Any) -> PodView:
    return PodView(**{"name": f"j-worker-{index}", "role": "worker", "index": index, "attempt": 0, "phase": phase,
                      "scheduled": True, "ip": f"10.0.0.{index}", **kw})


def observed(pods: list[PodView], **kw: Any) -> Observed:
    return Observed(generation=1, spec=SPEC, accepted=SPEC, status=dict(RUNNING), pods=pods, now=NOW, **kw)


def test_running_comm_fraction_from_rank0() -> None:
    progress = {names.STEP: 120.0, names.COMM_SECONDS_TOTAL: 3.0, names.STEP_SECONDS_SUM: 12.0}
    st = decide(observed([pod(0), pod(1)], progress=progress)).status
    assert st["step"] == 120 and st["commFraction"] == 0.25


def test_success_reports_summary_fraction_and_device() -> None:
    msg = '{"steps": 400, "testAccuracy": 0.97, "commFraction": 0.123456, "device": "cpu"}'
    st = decide(observed([pod(0, "Succeeded", exit_code=0, message=msg), pod(1, "Succeeded")])).status
    assert st["commFraction"] == 0.1235 and st["result"]["device"] == "cpu"
    (cond,) = [c for c in st["conditions"] if c["type"] == "Succeeded"]
    assert cond["message"].startswith("training finished on cpu: test accuracy 0.97")


def test_gpu_pod_without_gpu_fails_the_job_with_the_reason() -> None:
    reason = ("disttrain-trainer: spec.workers.resources.gpus=1 but this process sees no CUDA device "
              "(torch 2.13.0+cpu, built for CUDA none); run a CUDA trainer image ...")
    plan = decide(observed([pod(0, "Failed", exit_code=exitcodes.CONFIG, message=reason), pod(1)]))
    st = plan.status
    assert st["phase"] == "Failed" and st["restarts"] == 0
    (cond,) = [c for c in st["conditions"] if c["type"] == "Failed"]
    assert cond["reason"] == "TrainerConfigError" and "no CUDA device" in cond["message"]
