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


def test_running_progress_from_rank0_with_the_rate_since_the_last_write() -> None:
    """SPEC: 500 steps of 256 samples. The previous write saw step 100 twenty seconds ago."""
    first = decide(observed([pod(0), pod(1)], progress={names.STEP: 100.0})).status["progress"]
    assert first["completed"] == 100 and first["total"] == 500 and first["percent"] == 20.0
    assert "eta" not in first  # one reading: no rate yet
    earlier = {**first, "lastUpdateTime": "2026-01-01T11:59:40.000Z"}
    status = {**RUNNING, "step": 100, "progress": earlier}
    obs = Observed(generation=1, spec=SPEC, accepted=SPEC, status=status, pods=[pod(0), pod(1)], now=NOW,
                   progress={names.STEP: 140.0, names.MFU: 0.3})  # fmt: skip
    prog = decide(obs).status["progress"]
    assert prog["rate"] == 2.0 and prog["samplesPerSecond"] == 512.0 and prog["mfu"] == 0.3
    assert prog["etaSeconds"] == 180 and prog["eta"] == "3m00s" and prog["lastUpdateTime"] == "2026-01-01T12:00:00.000Z"


def test_success_reports_progress_done() -> None:
    msg = '{"steps": 500, "samplesPerS": 900.5, "device": "cpu"}'
    st = decide(observed([pod(0, "Succeeded", exit_code=0, message=msg), pod(1, "Succeeded")])).status
    assert st["progress"]["percent"] == 100.0 and st["progress"]["eta"] == "0s"
    assert st["progress"]["samplesPerSecond"] == 900.5


def test_progress_is_measured_to_when_the_reading_was_taken_not_to_the_reconcile() -> None:
    earlier = {"completed": 100, "total": 500, "unit": "steps", "percent": 20.0,
               "lastUpdateTime": "2026-01-01T11:59:40.000Z"}  # fmt: skip
    taken = datetime(2026, 1, 1, 11, 59, 58, tzinfo=UTC)  # scraped 2 s before this reconcile
    obs = Observed(generation=1, spec=SPEC, accepted=SPEC, status={**RUNNING, "progress": earlier},
                   pods=[pod(0), pod(1)], now=NOW, progress={names.STEP: 136.0}, progress_time=taken)  # fmt: skip
    prog = decide(obs).status["progress"]
    assert prog["rate"] == 2.0 and prog["lastUpdateTime"] == "2026-01-01T11:59:58.000Z"  # 36 steps in 18 s
