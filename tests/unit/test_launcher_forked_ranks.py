"""Which ranks a local launcher forks from its forkserver, and which it must exec: a fork
inherits what the forkserver's interpreter and torch read while they started."""

from __future__ import annotations

import sys

from disttrain_api import constants as C
from disttrain_trainer.launcher.env import trainer_command
from disttrain_trainer.launcher.forked_ranks import forkable

# The forkserver's environment: the launcher's, with the ranks' thread count (RankForker's `threads`).
LAUNCHER = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}


def rank_env(**extra: str) -> dict[str, str]:
    return {**LAUNCHER, C.ENV_RANK: "1", C.ENV_WORLD_SIZE: "2", C.ENV_MASTER_PORT: "29500", C.ENV_CONFIG: "/x.json",
            C.ENV_FT_LIGHTHOUSE: "http://127.0.0.1:1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def test_the_process_contract_and_what_the_trainer_applies_itself_may_differ() -> None:
    assert forkable(trainer_command(sys.executable), rank_env(), LAUNCHER)
    assert forkable(trainer_command(sys.executable), rank_env(DISTTRAIN_FAULT_STEP_SLEEP_S="1"), LAUNCHER)


def test_what_the_interpreter_or_torch_reads_at_start_is_exec_d() -> None:
    for key in ("PYTHONPATH", "PYTHONHASHSEED", "TORCH_SHOW_CPP_STACKTRACES", "LD_PRELOAD", "RUST_LOG"):
        assert not forkable(trainer_command(sys.executable), rank_env(**{key: "x"}), LAUNCHER), key
    # A variable of the launcher's that the job's env removes or changes counts too.
    assert not forkable(trainer_command(sys.executable), {k: v for k, v in rank_env().items() if k != "LANG"},
                        LAUNCHER)  # fmt: skip
    assert not forkable(trainer_command(sys.executable), rank_env(HOME="/tmp"), LAUNCHER)
    # torch's thread pools read the thread count at import: a rank given another one is exec'd.
    assert not forkable(trainer_command(sys.executable), rank_env(OMP_NUM_THREADS="2"), LAUNCHER)


def test_another_python_or_program_is_exec_d() -> None:
    assert not forkable(trainer_command("/usr/bin/python3"), rank_env(), LAUNCHER)
    assert not forkable([sys.executable, "-m", "disttrain_trainer", "--extra"], rank_env(), LAUNCHER)
    assert not forkable([sys.executable, "-c", "pass"], rank_env(), LAUNCHER)
