"""Checkpoint writers as real processes sharing one directory: a writer SIGKILLed at every point of
re-saving a step, and writers of an old and a new restart attempt (fencing).

Every writer is its own forked process (its own claim on the directory, checkpoint_fence.py);
the test process never writes to these directories itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch
from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_trainer.checkpoints import whole as ckpt

FORK = mp.get_context("fork")  # cheap: torch is imported already; a fresh interpreter takes seconds here


def _arm_kill(k: int) -> list[bool]:
    """SIGKILL this process at its k-th rename or tree removal while armed (a crash mid-save)."""
    armed, calls = [False], [0]

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if armed[0]:
                calls[0] += 1
                if calls[0] == k:
                    os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return wrapper

    if k:
        os.rename = counted(os.rename)  # type: ignore[assignment]
        shutil.rmtree = counted(shutil.rmtree)  # type: ignore[assignment]
    return armed


def _serve(root: Path, attempt: int, job_uid: str, kill_at: int, env: dict[str, str], conn: Connection) -> None:
    os.environ.update(env)
    armed = _arm_kill(kill_at)
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "take-over":  # what every writer does first (rank 0, aggregator, PS shard)
                from disttrain_trainer.checkpoints import directory as cdir
                from disttrain_trainer.checkpoints.fence import Writer

                out: Any = cdir.take_over(root, Writer(job_uid=job_uid, attempt=attempt)).generation
            elif cmd == "save":
                step, value, keep = args
                armed[0] = True
                ckpt.save(root, {"v": value, "w": torch.full((1000,), float(value))}, step, keep=keep, world_size=1)
                armed[0] = False
                out = None
            elif cmd == "load-latest":
                found = ckpt.load_latest(root)
                out = (found[0], found[1]["v"]) if found else None
            elif cmd == "clean":
                out = ckpt.clean_partial(root) and None
            elif cmd == "prune":
                out = ckpt.prune(root, args[0])
            else:
                raise ValueError(cmd)
        except Exception as e:
            from disttrain_trainer.checkpoints import fence

            if isinstance(e, fence.Fenced):
                fence.exit_fenced(e)  # as the trainer does: one line, exit FENCED
            raise
        conn.send(out)


class WriterProcess:
    def __init__(self, root: Path, *, attempt: int = 0, job_uid: str = "", kill_at: int = 0,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.conn, child = FORK.Pipe()
        self.proc = FORK.Process(target=_serve, args=(root, attempt, job_uid, kill_at, env or {}, child), daemon=True)
        self.proc.start()
        child.close()

    def do(self, *cmd: Any) -> Any:
        """Run one command; raises Gone (with the exit code) if the process ended instead of answering."""
        self.conn.send(cmd)
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(30)
            raise Gone(self.proc.exitcode) from None

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(30)


class Gone(Exception):
    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"writer process ended with exit code {exitcode}")
        self.exitcode = exitcode


def run_writer(root: Path, *cmds: tuple[Any, ...], **kw: Any) -> list[Any]:
    w = WriterProcess(root, **kw)
    try:
        return [w.do(*c) for c in cmds]
    finally:
        w.close()


# ----------------------------------------------------------------- crash mid re-save


def test_a_crash_at_any_point_of_a_resave_leaves_one_complete_copy(tmp_path: Path) -> None:
    """Step 7 exists (v=1) and is saved again (v=2); the writer is killed at its k-th rename or
    removal, for every k until the save completes. The restarted job (clean up, load the newest)
    must find step 7, old or new."""
    outcomes: list[int] = []
    for k in range(1, 20):
        root = tmp_path / f"kill-{k}"
        run_writer(root, ("save", 5, 0, 3), ("save", 7, 1, 3))
        try:
            run_writer(root, ("save", 7, 2, 3), kill_at=k)
            completed = True
        except Gone as e:
            assert e.exitcode == -signal.SIGKILL
            completed = False
        found = run_writer(root, ("clean",), ("load-latest",))[-1]
        assert found is not None and found[0] == 7 and found[1] in (1, 2), (k, found, sorted(os.listdir(root)))
        outcomes.append(found[1])
        if completed:  # k passed every rename/removal of the save
            assert found[1] == 2
            break
    else:
        pytest.fail("the save never completed")
    assert 1 in outcomes, outcomes  # some crash points came before the new copy was in place


def test_a_crash_while_writing_the_new_copy_keeps_the_old_one(tmp_path: Path) -> None:
    run_writer(tmp_path, ("save", 7, 1, 3))
    with pytest.raises(Gone) as died:
        run_writer(tmp_path, ("save", 7, 2, 3), env={C.ENV_FAULT_KILL_IN_CHECKPOINT: "7"})
    assert died.value.exitcode == -signal.SIGKILL
    assert run_writer(tmp_path, ("clean",), ("load-latest",))[-1] == (7, 1)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".replacing-"))]


# ----------------------------------------------------------------- fencing


def steps_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("action", [("save", 30, -1, 3), ("prune", 1)], ids=["publish", "prune"])
def test_an_old_attempt_cannot_publish_or_prune_after_a_new_one_started(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], action: tuple[Any, ...]
) -> None:
    """Rank 0 of attempt 0 runs on, partitioned, after attempt 1 started on the same directory."""
    old = WriterProcess(tmp_path, attempt=0, job_uid="uid-1")
    new = WriterProcess(tmp_path, attempt=1, job_uid="uid-1")
    try:
        old.do("take-over")
        old.do("save", 10, 10, 3)
        old.do("save", 20, 20, 3)
        new.do("take-over")
        assert new.do("load-latest") == (20, 20)
        new.do("save", 30, 30, 3)
        with pytest.raises(Gone) as gone:  # the zombie replaces step 30 / prunes down to one
            old.do(*action)
        assert gone.value.exitcode == exitcodes.FENCED
        assert "fenced: refused to" in capfd.readouterr().err
        assert steps_in(tmp_path) == ["step-00000010", "step-00000020", "step-00000030"]
        assert new.do("load-latest") == (30, 30)  # the new attempt's checkpoint, intact
        new.do("save", 40, 40, 2)
        assert steps_in(tmp_path) == ["step-00000030", "step-00000040"]
    finally:
        old.close()
        new.close()


def test_a_late_process_of_an_old_attempt_is_refused_before_it_writes(tmp_path: Path) -> None:
    run_writer(tmp_path, ("take-over",), ("save", 10, 10, 3), attempt=2, job_uid="uid-1")
    with pytest.raises(Gone) as gone:
        run_writer(tmp_path, ("take-over",), attempt=1, job_uid="uid-1")
    assert gone.value.exitcode == exitcodes.FENCED
    # A new job of the same name (another UID) starts again at attempt 0: it takes over.
    assert run_writer(tmp_path, ("take-over",), ("load-latest",), attempt=0, job_uid="uid-2")[-1] == (10, 10)


def test_a_rename_that_slipped_past_the_fence_is_never_picked_nor_pruned(tmp_path: Path) -> None:
    """The residual window: the old writer checked its claim, then the new one claimed, then the
    old writer's rename landed. That checkpoint stays out of every later writer's way."""
    held = tmp_path / "held"
    root = tmp_path / "ckpt"
    run_writer(root, ("take-over",), ("save", 10, 10, 3), ("save", 50, 50, 3), attempt=0, job_uid="uid-1")
    (root / ckpt.name_for(50)).rename(held)  # its rename had not happened yet...
    new = WriterProcess(root, attempt=1, job_uid="uid-1")
    try:
        new.do("take-over")
        held.rename(root / ckpt.name_for(50))  # ...and lands after the new claim
        assert new.do("load-latest") == (10, 10)
        new.do("save", 20, 20, 1)
        assert steps_in(root) == ["step-00000020", "step-00000050"]  # 10 pruned, 50 not this writer's
    finally:
        new.close()
    assert run_writer(root, ("take-over",), ("load-latest",), attempt=2, job_uid="uid-1")[-1] == (20, 20)


def test_a_writer_whose_claim_was_pruned_is_fenced_too(tmp_path: Path) -> None:
    """Old claims are removed after many newer ones; the next claim after this writer's is among
    them, so only its own missing claim can tell it that it was replaced."""
    from disttrain_trainer.checkpoints.fence import KEEP_CLAIMS

    old = WriterProcess(tmp_path, attempt=0, job_uid="uid-1")
    try:
        old.do("take-over")
        old.do("save", 10, 10, 3)
        for attempt in range(1, KEEP_CLAIMS + 3):  # a crash-looping job, restarted again and again
            run_writer(tmp_path, ("take-over",), attempt=attempt, job_uid="uid-1")
        assert not (tmp_path / ".fence" / f"{2:012d}").exists()  # the claim after old's is gone
        with pytest.raises(Gone) as gone:
            old.do("save", 20, 20, 3)
        assert gone.value.exitcode == exitcodes.FENCED
        assert steps_in(tmp_path) == ["step-00000010"]
    finally:
        old.close()
