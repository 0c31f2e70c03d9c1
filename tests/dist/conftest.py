"""Fixtures for multi-process trainer tests: real trainer processes on gloo.

A rank is what `disttrain local` starts: a fork of a forkserver that imported torch once (one per
pytest worker, `RankForker`), or `python -m disttrain_trainer` exec'd where a fork would start it
differently (a test's env sets a variable read at start-up). Forking spares each rank seconds of
CPU on imports, which on a 2-core machine is most of what these tests cost.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from disttrain_api import constants as C
from disttrain_api.model import parse_spec, to_json
from disttrain_trainer.launcher.env import trainer_command
from disttrain_trainer.launcher.forked_ranks import FORKSERVER_LOG, ForkedRank, RankForker
from disttrain_trainer.launcher.gang import start_rank

# This folder's helper modules (the workers) for the tests here: pytest imports test modules with
# --import-mode=importlib, which puts no test folder on sys.path (tests/conftest.py puts tests/
# there, for ports.py).
sys.path.insert(0, str(Path(__file__).parent))
from ports import free_port  # noqa: E402

RANK_TIMEOUT_S = 240
RANK_THREADS = 1
# Set by pytest for each test phase: not the trainer's business, and it would make every rank's
# environment differ from the forkserver's (an exec instead of a fork).
PYTEST_ENV = "PYTEST_CURRENT_TEST"
_forker: RankForker | None = None
_log_names = itertools.count()


def rank_forker(folder: Path) -> RankForker:
    """This pytest worker's forkserver, started on first use (it imports torch while the test goes on)."""
    global _forker  # noqa: PLW0603 - one forkserver per process, as multiprocessing keeps it
    if _forker is None:
        current = os.environ.pop(PYTEST_ENV, None)
        try:
            _forker = RankForker(log=folder / FORKSERVER_LOG, threads=RANK_THREADS)
        finally:
            if current is not None:
                os.environ[PYTEST_ENV] = current
    return _forker


class Rank:
    """One trainer process as a test drives it, forked or exec'd: pid, poll, kill, wait, and its
    output (stdout and stderr together) from its log once it has exited."""

    def __init__(self, process: ForkedRank | subprocess.Popen[bytes], log: Path) -> None:
        self._process = process
        self.pid = process.pid
        self.log = log

    def poll(self) -> int | None:
        return self._process.poll()

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # exited since the poll

    def wait(self, timeout: float | None = None) -> int:
        return self._process.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="backslashreplace")


@dataclass
class RunResult:
    run_dir: Path
    checkpoint_dir: Path  # <root>/<job>
    returncodes: list[int]
    outputs: list[str]

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())

    def log(self, rank: int = 0) -> list[dict[str, Any]]:
        lines = (self.run_dir / f"metrics-rank{rank}.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines]

    def steps_log(self, rank: int = 0) -> list[dict[str, Any]]:
        return [r for r in self.log(rank) if "event" not in r]


class TrainerLauncher:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ckpt_root = tmp / "checkpoints"
        self.data_cache = tmp.parent / "disttrain-test-data"  # shared by tests of one session

    def spec_file(self, spec: dict[str, Any], name: str) -> Path:
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(to_json(parse_spec(spec))))
        return path

    def run(
        self,
        spec: dict[str, Any],
        *,
        world: int,
        job: str,
        env: dict[str, str] | None = None,
        rank_env: list[dict[str, str]] | None = None,
        expect_ok: bool = True,
        timeout: float = RANK_TIMEOUT_S,
    ) -> RunResult:
        return self.start(spec, world=world, job=job, env=env, rank_env=rank_env).wait(expect_ok=expect_ok,
                                                                                    timeout=timeout)  # fmt: skip

    def start(self, spec: dict[str, Any], *, world: int, job: str, env: dict[str, str] | None = None,
              rank_env: list[dict[str, str]] | None = None) -> Started:  # fmt: skip
        """The job's ranks started and not waited for (`Started.wait` collects them); `rank_env`:
        each rank's own additions (e.g. a checkpoint folder per rank, as on pods of their own)."""
        config = self.spec_file(spec, job)
        run_dir = Path((env or {}).get(C.ENV_RUN_DIR) or self.tmp / "runs" / job)
        logs = self.tmp / "rank-logs"
        logs.mkdir(exist_ok=True)
        forker = rank_forker(self.tmp.parent)
        port = free_port()
        procs = []
        for rank in range(world):
            e = {
                **{k: v for k, v in os.environ.items() if k != PYTEST_ENV},
                C.ENV_CONFIG: str(config),
                C.ENV_WORLD_SIZE: str(world),
                C.ENV_RANK: str(rank),
                C.ENV_LOCAL_RANK: str(rank),
                C.ENV_NODE_RANK: str(rank),
                C.ENV_NPROC_PER_NODE: "1",
                C.ENV_MASTER_ADDR: "127.0.0.1",
                C.ENV_MASTER_PORT: str(port),
                C.ENV_JOB: job,
                C.ENV_CHECKPOINT_DIR: str(self.ckpt_root),
                C.ENV_RUN_DIR: str(run_dir),
                C.ENV_METRICS_PORT: "0",
                C.ENV_TERMINATION_LOG: str(self.tmp / f"termination-{job}-{rank}.log"),
                C.ENV_DATA_CACHE: str(self.data_cache),
                "OMP_NUM_THREADS": str(RANK_THREADS),
                **(env or {}),
                **(rank_env[rank] if rank_env else {}),
            }
            log = logs / f"{job}-rank{rank}-{next(_log_names)}.log"
            process, _ = start_rank(trainer_command(sys.executable), e, None, log, f"{job}, rank {rank}", forker)
            procs.append(Rank(process, log))
        return Started(procs=procs, run_dir=run_dir, checkpoint_dir=self.ckpt_root / job)


@dataclass
class Started:
    procs: list[Rank]
    run_dir: Path
    checkpoint_dir: Path

    def wait(self, *, expect_ok: bool = True, timeout: float = RANK_TIMEOUT_S) -> RunResult:
        codes = []
        try:
            for p in self.procs:
                codes.append(p.wait(timeout=timeout))
        finally:
            for p in self.procs:
                p.kill()
                p.wait()
        outputs = [p.output() for p in self.procs]
        result = RunResult(self.run_dir, self.checkpoint_dir, codes, outputs)
        if expect_ok:
            assert result.returncodes == [0] * len(self.procs), "\n".join(outputs)[-4000:]
        return result


@pytest.fixture
def trainer(tmp_path: Path) -> TrainerLauncher:
    return TrainerLauncher(tmp_path)


def digits_spec(**over: Any) -> dict[str, Any]:
    """A tiny MLP on digits; `over` replaces whole sections, e.g. training={...}."""
    spec: dict[str, Any] = {
        "mode": "data",
        "model": {"name": "mlp", "hidden": 32, "layers": 2},
        "data": {"name": "digits", "batchSize": 64, "seed": 3, "shards": 3},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "baseBatchSize": 64, "warmupSteps": 5,
                      "decay": "cosine"},
        "training": {"steps": 20, "logIntervalSteps": 1},
        "checkpoint": {"intervalSteps": 20, "keep": 3},
    }  # fmt: skip
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return spec


@pytest.fixture
def make_digits_spec():  # noqa: ANN201
    return digits_spec


def _gloo_entry(rank: int, world: int, port: int, fn: Any, args: tuple[Any, ...]) -> None:
    import torch  # noqa: PLC0415 - the trainer-process tests above never import torch here
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(*args)
    finally:
        dist.destroy_process_group()


def run_gloo(fn: Any, world: int, *args: Any) -> None:
    """Run fn(*args) in `world` fresh gloo processes; raises if any of them fails.

    fork, not spawn: the workers are functions of test modules, which a spawned
    child could not import (pytest's importlib mode)."""
    import torch.multiprocessing as mp

    mp.start_processes(_gloo_entry, args=(world, free_port(), fn, args), nprocs=world, join=True,
                       start_method="fork")  # fmt: skip


@pytest.fixture
def gloo():  # noqa: ANN201
    return run_gloo


@pytest.fixture(scope="module")
def module_trainer(tmp_path_factory: pytest.TempPathFactory) -> TrainerLauncher:
    """One launcher for a whole test module: runs shared by several tests (e.g. one reference run)."""
    return TrainerLauncher(tmp_path_factory.mktemp("runs"))
