"""The env contract of `disttrain local`: ranks, ports, devices, user env."""

from __future__ import annotations

from pathlib import Path

from disttrain_api import constants as C
from disttrain_trainer.launcher import env as E


def _gang(**over: object) -> E.GangEnv:
    kw: dict[str, object] = dict(
        job="demo",
        world_size=4,
        procs_per_worker=2,
        master_port=29555,
        config_path=Path("/run/demo/config.json"),
        run_dir=Path("/run/demo"),
        checkpoint_dir=Path("/run/demo/checkpoints"),
        termination_log=Path("/run/demo/termination-log"),
        restart_attempt=1,
        device=E.DevicePlan(device="cpu", visible=None),
        threads=1,
    )
    kw.update(over)
    return E.GangEnv(**kw)  # type: ignore[arg-type]


def test_slots_are_pod_major_like_the_operator() -> None:
    slots = E.gang_slots(2, 2)
    assert [(s.rank, s.node_rank, s.local_rank) for s in slots] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
    ]


def test_process_env_sets_the_whole_contract() -> None:
    slot = E.gang_slots(2, 2)[3]
    env = E.process_env({"PATH": "/bin"}, _gang(), slot, metrics_port=40001)
    assert env[C.ENV_MASTER_ADDR] == "127.0.0.1"
    assert env[C.ENV_MASTER_PORT] == "29555"
    assert env[C.ENV_WORLD_SIZE] == "4"
    assert (env[C.ENV_RANK], env[C.ENV_LOCAL_RANK], env[C.ENV_NODE_RANK]) == ("3", "1", "1")
    assert env[C.ENV_NPROC_PER_NODE] == "2"
    assert env[C.ENV_JOB] == "demo"
    assert env[C.ENV_CONFIG] == "/run/demo/config.json"
    assert env[C.ENV_RESTART_ATTEMPT] == "1"
    assert env[C.ENV_CHECKPOINT_DIR] == "/run/demo/checkpoints"
    assert env[C.ENV_RUN_DIR] == "/run/demo"
    assert env[C.ENV_TERMINATION_LOG] == "/run/demo/termination-log"
    assert env[C.ENV_DEVICE] == "cpu"
    # The trainer serves base + LOCAL_RANK: base is chosen so rank 3 lands on its own port.
    assert int(env[C.ENV_METRICS_PORT]) + slot.local_rank == 40001
    assert env["PATH"] == "/bin"


def test_user_env_is_kept_but_cannot_break_the_contract() -> None:
    user = {"RANK": "7", "OMP_NUM_THREADS": "3", "MY_FLAG": "x"}
    env = E.process_env(user, _gang(threads=1), E.gang_slots(1, 1)[0], metrics_port=0)
    assert env["RANK"] == "0"  # a stale RANK in the shell must not survive
    assert env["OMP_NUM_THREADS"] == "3"  # the user's thread count wins over the default
    assert env["MY_FLAG"] == "x"
    assert env[C.ENV_METRICS_PORT] == "0"


def test_metrics_ports() -> None:
    assert E.metrics_ports(0, 3) == [0, 0, 0]
    assert E.metrics_ports(9400, 3) == [9400, 9401, 9402]
    auto = E.metrics_ports(None, 4)
    assert len(set(auto)) == 4 and all(p > 0 for p in auto)


def test_template_env_takes_literal_values_and_warns_about_value_from() -> None:
    env, warnings = E.template_env(
        {"env": [{"name": "A", "value": 1}, {"name": "B", "valueFrom": {"fieldRef": {}}}, {"x": 1}]}
    )
    assert env == {"A": "1"}
    assert len(warnings) == 2 and "valueFrom" in warnings[0] and "env[2]" in warnings[1]


def test_no_cuda_runs_on_cpu_and_warns_only_when_gpus_were_asked_for() -> None:
    plan = E.plan_devices(gpus=0, replicas=2, procs_per_worker=1, cuda_count=0, user_device=None)
    assert plan.device == "cpu" and plan.warning is None
    plan = E.plan_devices(gpus=1, replicas=2, procs_per_worker=1, cuda_count=0, user_device=None)
    assert plan.device == "cpu" and plan.warning and "CUDA is not available" in plan.warning


def test_gpus_are_split_per_replica_like_pods() -> None:
    plan = E.plan_devices(gpus=2, replicas=2, procs_per_worker=2, cuda_count=4, user_device=None)
    assert plan.device == "cuda" and plan.visible == ("0,1", "2,3")
    short = E.plan_devices(gpus=2, replicas=2, procs_per_worker=2, cuda_count=3, user_device=None)
    assert short.device == "cpu" and short.warning and "needs 4 GPUs" in short.warning
    forced = E.plan_devices(gpus=1, replicas=1, procs_per_worker=1, cuda_count=1, user_device="cpu")
    assert forced.device == "cpu"


def test_default_threads_share_the_cores() -> None:
    assert E.default_threads(2, cpu_count=2) == 1
    assert E.default_threads(2, cpu_count=16) == 8
    assert E.default_threads(8, cpu_count=2) == 1
