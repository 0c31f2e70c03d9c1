"""No silent CPU fallback: a GPU job whose process sees no CUDA device fails with exit code 2
and a message naming the fix, unless the job (spec.workers.allowCPUFallback) or the operator
(DISTTRAIN_ALLOW_CPU_FALLBACK on every pod) allows it; and the operator's GPU placement
settings reach the pods. Processes run with CUDA_VISIBLE_DEVICES="" so they see no GPU on any
machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from disttrain_api import constants as c
from disttrain_api import exitcodes
from disttrain_api import model as api
from disttrain_operator import settings
from disttrain_operator.topology import build_children
from disttrain_operator.topology.common import BuildContext

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}

# One process picks the device for every case (importing torch is the slow part).
PICK = """
import json, sys, warnings
from disttrain_trainer.process.config import ConfigError, load_config
from disttrain_trainer.process.dist_env import pick_device
results = []
for env in json.load(sys.stdin):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = {"device": pick_device(load_config(env)).type}
        except ConfigError as e:
            out = {"error": str(e)}
    out["warnings"] = [str(w.message) for w in caught]
    results.append(out)
print(json.dumps(results))
"""

CASES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "cpu-job": ({"resources": {"gpus": 0}}, {}),  # a CPU job: CPU is normal
    "job-allows": ({"resources": {"gpus": 1}, "allowCPUFallback": True}, {}),
    "operator-allows": ({"resources": {"gpus": 1}}, {c.ENV_ALLOW_CPU_FALLBACK: "true"}),
    # `disttrain local` on a laptop says cpu explicitly (and warns itself).
    "forced-cpu": ({"resources": {"gpus": 1}}, {c.ENV_DEVICE: "cpu"}),
    "refused": ({"resources": {"gpus": 2}}, {}),
}


def write_spec(path: Path, workers: dict[str, Any]) -> Path:
    spec = api.parse_spec({"workers": {"replicas": 1, **workers}})
    path.write_text(json.dumps(api.to_json(spec)))
    return path


def trainer_env(config: Path, **extra: str) -> dict[str, str]:
    return {c.ENV_CONFIG: str(config), c.ENV_RANK: "0", c.ENV_WORLD_SIZE: "1", c.ENV_JOB: "fallback",
            c.ENV_METRICS_PORT: "0", **extra}


@pytest.fixture(scope="module")
def picked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pick")
    envs = [trainer_env(write_spec(tmp / f"{name}.json", workers), **env) for name, (workers, env) in CASES.items()]
    proc = subprocess.run([sys.executable, "-c", PICK], input=json.dumps(envs), env={**os.environ, **NO_GPU},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(zip(CASES, json.loads(proc.stdout.splitlines()[-1]), strict=True))


@pytest.mark.parametrize(("case", "warned"), [("cpu-job", False), ("job-allows", True), ("operator-allows", True),
                                              ("forced-cpu", False)])
def test_cpu_when_allowed(picked: dict[str, dict[str, Any]], case: str, warned: bool) -> None:
    out = picked[case]
    assert out.get("device") == "cpu", out
    assert any("training on CPU" in w for w in out["warnings"]) == warned, out


def test_gpu_job_without_gpu_is_refused(picked: dict[str, dict[str, Any]]) -> None:
    out = picked["refused"]
    assert "error" in out, out
    assert "spec.workers.resources.gpus=2" in out["error"] and "no CUDA device" in out["error"]
    assert "allowCPUFallback" in out["error"] and c.ENV_ALLOW_CPU_FALLBACK in out["error"]


def test_trainer_exits_2_with_the_reason(tmp_path: Path) -> None:
    # The whole trainer as a pod runs it: the exit code tells the operator not to retry, the
    # stderr line becomes the pod's termination message and so the job's status message.
    keep = {k: v for k, v in os.environ.items() if not k.startswith("DISTTRAIN_")}
    env = {**keep, **NO_GPU, **trainer_env(write_spec(tmp_path / "config.json", {"resources": {"gpus": 1}}),
                                           **{c.ENV_RUN_DIR: str(tmp_path / "run"),
                                              c.ENV_CHECKPOINT_DIR: str(tmp_path / "ck")})}
    proc = subprocess.run([sys.executable, "-m", "disttrain_trainer"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == exitcodes.CONFIG, proc.stderr
    assert "no CUDA device" in proc.stderr.strip().splitlines()[-1]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def pods(workers: dict[str, Any], **ctx: Any) -> list[dict[str, Any]]:
    spec = api.parse_spec({"mode": "data", "workers": {"replicas": 2, **workers}})
    return build_children(spec, BuildContext(name="j", namespace="ml", image="img", replicas=2, **ctx)).pods


GPUS = settings.GpuPods(node_selector={"nvidia.com/gpu.present": "true"},
                        tolerations=({"key": "gpu", "operator": "Exists"},), runtime_class_name="nvidia")


def test_operator_settings_reach_the_pods() -> None:
    cfg = settings.from_env({"DISTTRAIN_OPERATOR_ALLOW_CPU_FALLBACK": "true",
                             "DISTTRAIN_OPERATOR_GPU_NODE_SELECTOR": '{"nvidia.com/gpu.present": "true"}',
                             "DISTTRAIN_OPERATOR_GPU_TOLERATIONS": '[{"key": "gpu", "operator": "Exists"}]',
                             "DISTTRAIN_OPERATOR_GPU_RUNTIME_CLASS": "nvidia"})
    assert cfg.allow_cpu_fallback and cfg.gpu == GPUS
    (pod, _) = pods({"resources": {"gpus": 1}}, gpu=cfg.gpu, allow_cpu_fallback=cfg.allow_cpu_fallback)
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and spec["runtimeClassName"] == "nvidia"
    assert spec["tolerations"] == [{"key": c.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                                   {"key": "gpu", "operator": "Exists"}]
    env = env_of(pod)
    assert env[c.ENV_ALLOW_CPU_FALLBACK] == "true" and env[c.ENV_NAMESPACE] == "ml"


def test_cpu_pods_ignore_gpu_placement_and_jobs_override_it() -> None:
    (cpu, _) = pods({"resources": {"gpus": 0}}, gpu=GPUS)
    assert not {"nodeSelector", "runtimeClassName", "tolerations"} & set(cpu["spec"])
    assert c.ENV_ALLOW_CPU_FALLBACK not in env_of(cpu)
    (own, _) = pods({"resources": {"gpus": 1}, "template": {"nodeSelector": {"pool": "a100"},
                                                             "runtimeClassName": "kata"}}, gpu=GPUS)
    assert own["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "a100"}
    assert own["spec"]["runtimeClassName"] == "kata"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [("GPU_NODE_SELECTOR", "{nope", "is not JSON"), ("GPU_TOLERATIONS", '{"key": "x"}', "must be a JSON list")],
)
def test_bad_gpu_settings_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"DISTTRAIN_OPERATOR_{name}.*{message}"):
        settings.from_env({f"DISTTRAIN_OPERATOR_{name}": value})
