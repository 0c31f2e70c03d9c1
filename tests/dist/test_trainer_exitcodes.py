"""Exit codes of real `python -m disttrain_trainer` processes: FAILED (1) for what a retry can
fix, CONFIG (2) for what fails again on every retry, also from ranks spawned for procsPerWorker > 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_api.model import parse_spec, to_json
from ports import free_port  # tests/ports.py: tests/conftest.py puts tests/ on sys.path

TIMEOUT_S = 600  # several torch processes start at once; on a loaded 2-core machine that is slow
# A model factory that only local rank 1 cannot import: one rank of a pod rejects the config.
PICKY_MODULE = """
import os
if os.environ.get("LOCAL_RANK") == "1":
    raise ImportError("this module is missing on local rank 1")
from disttrain_trainer.models import MODELS
def factory(spec, ds):
    return MODELS["mlp"](spec, ds)
"""


@pytest.fixture
def digits_spec(make_digits_spec) -> Callable[..., dict[str, Any]]:  # noqa: ANN001
    return make_digits_spec


def _env(tmp: Path, spec: dict[str, Any], name: str, **over: str) -> dict[str, str]:
    config = tmp / f"{name}.json"
    config.write_text(json.dumps(to_json(parse_spec(spec))))
    env = {
        **os.environ,
        C.ENV_CONFIG: str(config),
        C.ENV_WORLD_SIZE: "1",
        C.ENV_RANK: "0",
        C.ENV_LOCAL_RANK: "0",
        C.ENV_NODE_RANK: "0",
        C.ENV_NPROC_PER_NODE: "1",
        C.ENV_MASTER_ADDR: "127.0.0.1",
        C.ENV_MASTER_PORT: str(free_port()),
        C.ENV_JOB: name,
        C.ENV_CHECKPOINT_DIR: str(tmp / "checkpoints"),
        C.ENV_RUN_DIR: str(tmp / "runs" / name),
        C.ENV_METRICS_PORT: "0",
        C.ENV_TERMINATION_LOG: str(tmp / f"termination-{name}"),
        C.ENV_DATA_CACHE: str(tmp.parent / "disttrain-test-data"),
        C.ENV_DEVICE: "cpu",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
    }
    env.update(over)
    for key in [k for k, v in over.items() if v == ""]:
        del env[key]
    return env


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "disttrain_trainer"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def test_each_error_exits_with_the_code_that_says_whether_a_retry_helps(
    tmp_path: Path, digits_spec
) -> None:  # noqa: ANN001
    (tmp_path / "picky_model.py").write_text(PICKY_MODULE)
    spec = digits_spec(training={"steps": 2})
    cases = {
        # transient: rank 0's pod may still be Pending, its name not in DNS yet
        "unresolvable-master": (exitcodes.FAILED, "did not resolve", _env(
            tmp_path, spec, "dns", **{C.ENV_MASTER_ADDR: "no-such-pod.invalid", C.ENV_WORLD_SIZE: "2",
                                     C.ENV_RANK: "1", C.ENV_RENDEZVOUS_TIMEOUT: "2"})),
        # transient: rank 1 of 2 never shows up
        "rendezvous-timeout": (exitcodes.FAILED, "did not meet", _env(
            tmp_path, spec, "alone", **{C.ENV_WORLD_SIZE: "2", C.ENV_RENDEZVOUS_TIMEOUT: "3"})),
        # permanent: fails the same way on every retry
        "fp16-on-cpu": (exitcodes.CONFIG, "fp16 needs a GPU", _env(
            tmp_path, digits_spec(training={"steps": 2, "precision": "fp16"}, workers={"resources": {"gpus": 1}}), "fp16")),
        "bad-factory": (exitcodes.CONFIG, "cannot import", _env(
            tmp_path, digits_spec(model={"name": "no_such_module:factory"}), "factory")),
        "batch-too-large": (exitcodes.CONFIG, "exceeds the", _env(
            tmp_path, digits_spec(data={"batchSize": 4096}), "batch")),
    }  # fmt: skip
    procs = {name: _start(env) for name, (_, _, env) in cases.items()}  # all at once: faster
    for name, proc in procs.items():
        code, out = _finish(proc)
        expected, message = cases[name][:2]
        assert code == expected, f"{name}: exit {code}\n{out[-3000:]}"
        assert message in out.splitlines()[-1], f"{name}: {out[-3000:]}"


def test_a_checkpoint_rank_0_loaded_but_another_rank_cannot_read_is_transient(
    trainer, tmp_path: Path, digits_spec
) -> None:  # noqa: ANN001
    spec = digits_spec(training={"steps": 10}, checkpoint={"intervalSteps": 5})
    trainer.run(spec, world=1, job="unshared")  # leaves checkpoints 5 and 10
    # Rank 1 sees an empty volume (as if the shared volume had not caught up yet).
    port = str(free_port())
    common = {C.ENV_WORLD_SIZE: "2", C.ENV_MASTER_PORT: port, C.ENV_JOB: "unshared",
              C.ENV_RENDEZVOUS_TIMEOUT: "60"}  # fmt: skip
    rank0 = _start(_env(tmp_path, spec, "unshared", **common,
                        **{C.ENV_CHECKPOINT_DIR: str(trainer.ckpt_root)}))  # fmt: skip
    rank1 = _start(_env(tmp_path, spec, "unshared", **common, **{
        C.ENV_RANK: "1", C.ENV_LOCAL_RANK: "1", C.ENV_NODE_RANK: "1",
        C.ENV_CHECKPOINT_DIR: str(tmp_path / "empty-volume")}))  # fmt: skip
    code1, out1 = _finish(rank1)
    code0, out0 = _finish(rank0)
    assert code1 == exitcodes.FAILED, out1[-3000:]
    assert "cannot read checkpoint step 10" in out1, out1[-3000:]
    assert code0 != exitcodes.CONFIG, out0[-3000:]


def test_procs_per_worker_2_a_config_error_in_one_spawned_rank_exits_2(
    tmp_path: Path, digits_spec
) -> None:  # noqa: ANN001
    (tmp_path / "picky_model.py").write_text(PICKY_MODULE)
    spec = digits_spec(model={"name": "picky_model:factory"}, training={"steps": 2},
                       workers={"replicas": 1, "procsPerWorker": 2})
    # One pod, two local ranks: no RANK, the trainer spawns them itself.
    pod = {C.ENV_WORLD_SIZE: "2", C.ENV_NPROC_PER_NODE: "2", C.ENV_RANK: "", C.ENV_LOCAL_RANK: ""}
    one_rank, both = (
        _start(_env(tmp_path, spec, "picky", **pod)),
        _start(_env(tmp_path, digits_spec(training={"steps": 2, "precision": "fp16"},
                                   workers={"replicas": 1, "procsPerWorker": 2, "resources": {"gpus": 2}}),
             "fp16x2", **pod)),
    )  # fmt: skip
    code, out = _finish(one_rank)
    assert code == exitcodes.CONFIG, out[-3000:]
    assert "rank 1: model.name 'picky_model:factory': cannot import" in out, out[-3000:]
    code, out = _finish(both)
    assert code == exitcodes.CONFIG, out[-3000:]
    assert "fp16 needs a GPU" in out, out[-3000:]


LOCAL_MANIFEST = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: picky}
spec:
  mode: data
  workers: {replicas: 1, procsPerWorker: 2}
  model: {name: "picky_model:factory"}
  data: {name: digits, batchSize: 64}
  training: {steps: 2}
  runPolicy: {backoffLimit: 3}
"""


def _local_run(tmp_path: Path, module: str, module_text: str, manifest_text: str) -> subprocess.CompletedProcess[str]:
    """`disttrain local` of `manifest_text`, with the model module `module` (`module_text`) importable."""
    (tmp_path / f"{module}.py").write_text(module_text)
    manifest = tmp_path / f"{module}.yaml"
    manifest.write_text(manifest_text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir",
         str(tmp_path / "run"), "--no-progress", "--metrics-port", "0"],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip


def test_disttrain_local_fails_at_once_when_one_process_of_a_replica_exits_2(tmp_path: Path) -> None:
    res = _local_run(tmp_path, "picky_model", PICKY_MODULE, LOCAL_MANIFEST)
    assert res.returncode == exitcodes.CONFIG, res.stdout + res.stderr
    assert "the trainer rejected the job: rank 1" in res.stderr, res.stderr
    assert "restarting" not in res.stdout, res.stdout


# A model whose own code exits with the stop code (3): nobody asked it to stop.
EXITS_3_MODULE = """
import sys
def factory(spec, ds):
    sys.exit(3)
"""
EXITS_3_MANIFEST = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: exits-3}
spec:
  mode: data
  workers: {replicas: 1}
  model: {name: "exits_3_model:factory"}
  data: {name: digits, batchSize: 64}
  training: {steps: 2}
  runPolicy: {backoffLimit: 1, activeDeadlineSeconds: 300}
"""


def test_disttrain_local_counts_an_exit_3_it_did_not_ask_for_until_the_backoff_limit(tmp_path: Path) -> None:
    """Exit 3 is a disruption (not counted) only after the launcher's own SIGTERM; a model that exits
    3 by itself would otherwise restart until the deadline."""
    res = _local_run(tmp_path, "exits_3_model", EXITS_3_MODULE, EXITS_3_MANIFEST)
    assert res.returncode == exitcodes.FAILED, res.stdout + res.stderr
    assert "BackoffLimitExceeded: 1 restarts (runPolicy.backoffLimit=1)" in res.stderr, res.stdout + res.stderr
    assert "exit code 3" in res.stderr and "a stop disttrain local did not ask for" in res.stdout, res.stdout
    summary = json.loads((tmp_path / "run" / "local-summary.json").read_text())
    assert summary["status"] == "Failed" and summary["restarts"] == 1, summary
