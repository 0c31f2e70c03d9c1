"""Pipeline, tensor and hybrid examples on a real cluster, through the operator.

Each example manifest runs (shortened) to Succeeded with the mode's result in the status;
a pipeline stage killed mid-run makes the operator restart the gang, which resumes from the
newest checkpoint and Succeeds, exactly as a data-parallel job does.

Written against tests/e2e/conftest.py (host-process operator, per-test namespace).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml

from .conftest import ROOT, Kubectl, OperatorProcess  # type: ignore[import-not-found]
from .test_operator import kill_worker  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(900)

# example file -> the mode its summary reports. The pipeline example runs in the killed-stage
# test below. The other pipeline schedules (pipedream.yaml among them) make the same pods as
# pipeline.yaml (one per stage): the schedule is the trainer's affair, and
# tests/dist/test_pipeline_local.py runs every schedule through `disttrain local`.
EXAMPLES = {"tensor": "tensor", "hybrid": "hybrid"}
# Under a second a step for the GPT examples on 500m pods in fp32: the operator path, a checkpoint and
# the result are what is checked here (tests/dist checks what the examples learn).
EXAMPLE_STEPS = 12


def example(stem: str, name: str, ns: str, *, steps: int, checkpoint_every: int) -> dict[str, Any]:
    """The example, shortened and sized for the local cluster's two small nodes."""
    obj = yaml.safe_load((ROOT / "manifests" / "examples" / f"{stem}.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": ns}
    spec = obj["spec"]
    spec["workers"]["resources"] = {"cpu": "500m", "memory": "2Gi"}
    training = spec["training"]
    training["steps"] = steps
    training["logIntervalSteps"] = 5
    training["evalIntervalSteps"] = steps
    # bf16 matmuls are emulated on CPUs without bf16 instructions (about 9x slower than fp32 here);
    # tests/dist/test_tensor_examples.py trains the examples at their own precision.
    training["precision"] = "fp32"
    spec["optimizer"]["warmupSteps"] = min(int(spec["optimizer"].get("warmupSteps", 0)), steps // 4)
    spec["checkpoint"]["intervalSteps"] = checkpoint_every
    return obj


def _status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return kubectl.job(ns, name).get("status") or {}


@pytest.mark.parametrize("stem", sorted(EXAMPLES))
def test_example_succeeds_through_the_operator(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, stem: str
) -> None:
    name = f"{stem}-{uuid.uuid4().hex[:5]}"
    obj = example(stem, name, namespace, steps=EXAMPLE_STEPS, checkpoint_every=EXAMPLE_STEPS // 2)
    kubectl.apply(obj)
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0 and int(status["step"]) == EXAMPLE_STEPS, status
    result = status["result"]
    assert result["mode"] == EXAMPLES[stem], result
    # Every mode reports the same time categories as data mode.
    for key in ("computeFraction", "commExposedFraction", "commBusyFraction", "dataFraction", "idleFraction"):
        assert 0.0 <= float(result[key]) <= 1.0, (key, result)


def test_killed_pipeline_stage_restarts_the_gang_and_resumes(
    request: pytest.FixtureRequest, kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    name = f"pp-kill-{uuid.uuid4().hex[:5]}"
    # 36 steps (about a second each on the local cluster's 500m pods): enough to kill a stage
    # after its second checkpoint and still resume with steps left.
    steps = 36
    obj = example("pipeline", name, namespace, steps=steps, checkpoint_every=4)
    kubectl.apply(obj)
    kubectl.wait_phase(namespace, name, ("Running",), timeout=300)
    kubectl.wait_for("a checkpoint and some progress",
                     lambda: int(_status(kubectl, namespace, name).get("step") or 0) >= 9,
                     timeout=400, interval=1.0)  # fmt: skip
    killed_at = int(_status(kubectl, namespace, name).get("step") or 0)
    assert killed_at < steps, f"the job finished (step {killed_at}) before stage 1 could be killed"
    counter = kill_worker(request, kubectl, namespace, name, f"{name}-worker-1")  # the last stage
    kubectl.wait_for(f"{counter} == 1", lambda: int(_status(kubectl, namespace, name).get(counter) or 0) >= 1,
                     timeout=180, interval=1.0)  # fmt: skip
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1 and status[counter] == 1, status
    assert int(status["step"]) == steps and status["result"]["mode"] == "pipeline", status


def test_pipeline_by_tensor_hybrid_succeeds_through_the_operator(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """Hybrid pipeline 2 x tensor 2: one tensor-parallel group per pod, one pod per stage."""
    name = f"pptp-{uuid.uuid4().hex[:5]}"
    obj = example("hybrid", name, namespace, steps=6, checkpoint_every=3)
    spec = obj["spec"]
    spec["parallelism"] = {"tensor": 2, "pipeline": 2, "schedule": "1F1B", "microbatches": 2, "dataStrategy": "ddp"}
    spec["model"] = {"name": "gpt", "hidden": 32, "layers": 2, "heads": 2, "blockSize": 16, "dropout": 0.1}
    spec["data"]["batchSize"] = 8
    kubectl.apply(obj)
    job = kubectl.wait_phase(namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert int(status["step"]) == 6 and status["restarts"] == 0, status
    assert status["result"]["layout"] == "dp=1,pp=2,tp=2", status["result"]
