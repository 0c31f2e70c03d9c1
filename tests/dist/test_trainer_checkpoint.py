"""Checkpoints with real trainer processes: kill mid-write, resume == uninterrupted, world size 2 -> 1,
a replaced gang fenced off the directory, a damaged newest sharded checkpoint moved aside."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch
from disttrain_api import constants as C
from disttrain_api import exitcodes
from disttrain_trainer.checkpoints import sharded as sc
from disttrain_trainer.checkpoints import whole as ckpt


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def final_model(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    loaded = ckpt.load_latest(result.checkpoint_dir)
    assert loaded is not None
    return loaded[1]["model"]


def test_kill_during_checkpoint_write_then_resume_equals_uninterrupted(
    trainer, make_digits_spec
) -> None:
    steps = {"steps": 40, "logIntervalSteps": 5}
    ref = trainer.run(
        make_digits_spec(training=steps, checkpoint={"intervalSteps": 40}), world=2, job="ref"
    )

    spec = make_digits_spec(training=steps, checkpoint={"intervalSteps": 10, "keep": 5})
    # Rank 0 SIGKILLs itself halfway through writing the step-30 checkpoint.
    crashed = trainer.run(
        spec, world=2, job="crash", env={C.ENV_FAULT_KILL_IN_CHECKPOINT: "30"}, expect_ok=False
    )
    assert crashed.returncodes[0] == -9, crashed.outputs[0][-2000:]
    assert crashed.returncodes[1] != 0
    root = crashed.checkpoint_dir
    partial = [p for p in root.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)]
    assert partial, "the fault hook should have left a half-written temp dir"
    assert (partial[0] / ckpt.STATE_FILE).stat().st_size > 0
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [10, 20]
    step, state = ckpt.load_latest(root)  # type: ignore[misc]
    assert step == 20 and state["step"] == 20 and state["sampler"]["offset"] > 0

    resumed = trainer.run(spec, world=2, job="crash")
    assert resumed.summary["resumedFromStep"] == 20
    assert not [p for p in root.iterdir() if p.name.startswith(ckpt.TMP_PREFIX)], (
        "partial dir not cleaned"
    )
    assert max_diff(final_model(ref), final_model(resumed)) < 1e-6


def test_checkpoint_from_world_size_2_resumes_at_world_size_1(trainer, make_digits_spec) -> None:
    steps = {"steps": 40, "logIntervalSteps": 5}
    spec = make_digits_spec(training=steps, checkpoint={"intervalSteps": 20})
    ref = trainer.run(spec, world=2, job="w2")  # uninterrupted, writes step 20 and 40
    # Start a world-size-1 job from the step-20 checkpoint of the world-size-2 job.
    target = trainer.ckpt_root / "w1"
    target.mkdir(parents=True)
    shutil.copytree(ref.checkpoint_dir / ckpt.name_for(20), target / ckpt.name_for(20))
    one = trainer.run(spec, world=1, job="w1")
    assert one.summary["resumedFromStep"] == 20 and one.summary["worldSize"] == 1
    # Same global batches, same optimizer state: the continuation matches the 2-process run.
    assert max_diff(final_model(ref), final_model(one)) < 1e-5


def _state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _wait_for(what: str, fn, timeout: float = 120.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _checkpoints(root: Path) -> dict[str, bytes]:
    """Every complete checkpoint's files, byte for byte."""
    return {f"{p.name}/{f.name}": f.read_bytes() for p in sorted(root.glob("step-*")) for f in sorted(p.iterdir())}


def test_a_replaced_gang_is_fenced_off_the_checkpoint_directory(trainer, make_digits_spec) -> None:
    """Its node lost, a gang's rank 0 (attempt 0) is frozen, not dead (a partition: SIGSTOP), while
    attempt 1 of the job starts on the same checkpoint directory and resumes from it. When the old
    process runs again it must write nothing: it exits FENCED with one log line, and the new
    attempt's checkpoints stay byte for byte as they were."""
    uid = {C.ENV_JOB_UID: "3f0c-fence"}
    spec = make_digits_spec(training={"steps": 100_000, "logIntervalSteps": 1},
                            checkpoint={"intervalSteps": 10, "keep": 3})  # fmt: skip
    old = trainer.start(spec, world=1, job="fence",
                        env={**uid, C.ENV_RESTART_ATTEMPT: "0", C.ENV_RUN_DIR: str(trainer.tmp / "old-run")})  # fmt: skip
    root = old.checkpoint_dir
    pid = old.procs[0].pid
    try:
        _wait_for("the old attempt's first checkpoints", lambda: len(ckpt.list_checkpoints(root)) >= 2)
        os.kill(pid, signal.SIGSTOP)
        _wait_for("the old attempt to stop", lambda: _state_of(pid) == "T")
        frozen_at = max(s for s, _ in ckpt.list_checkpoints(root))
        new_spec = {**spec, "training": {**spec["training"], "steps": frozen_at + 30}}
        new = trainer.run(new_spec, world=1, job="fence", env={**uid, C.ENV_RESTART_ATTEMPT: "1"})
        assert new.summary["resumedFromStep"] == frozen_at and new.summary["steps"] == frozen_at + 30
        written = _checkpoints(root)
        assert sorted({k.split("/")[0] for k in written})[-3:] == [ckpt.name_for(frozen_at + d) for d in (10, 20, 30)]
        os.kill(pid, signal.SIGCONT)  # the partition heals: the old process runs on
        done = old.wait(expect_ok=False, timeout=60)
    finally:
        if old.procs[0].poll() is None:
            os.kill(pid, signal.SIGCONT)
            old.procs[0].kill()
    assert done.returncodes == [exitcodes.FENCED], done.outputs[0][-3000:]
    assert "fenced: refused to" in done.outputs[0] and "replaced gang" in done.outputs[0]
    assert _checkpoints(root) == written
    assert not list(root.glob(f"{ckpt.TMP_PREFIX}*")) and not list(root.glob("*.corrupt"))


def _gpt_tensor_spec() -> dict[str, Any]:
    return {
        "mode": "tensor",
        "parallelism": {"tensor": 2},
        "model": {"name": "gpt", "hidden": 32, "layers": 2, "heads": 4, "blockSize": 16, "dropout": 0.0},
        "data": {"name": "pytext", "batchSize": 8, "seed": 1, "shards": 2},
        "optimizer": {"name": "adamw", "lr": 0.003, "scaleLR": "none", "warmupSteps": 2, "decay": "none"},
        "training": {"steps": 18, "logIntervalSteps": 6},
        "checkpoint": {"intervalSteps": 6, "keep": 3},
    }  # fmt: skip


def _truncate_shard(path: Path) -> None:
    shard = sorted(path.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _garbage_in_shard(path: Path) -> None:
    """Same size: the manifest and DCP's metadata cannot tell; only the load does (on every rank)."""
    shard = sorted(path.glob("*.distcp"))[-1]
    shard.write_bytes(b"\xff" * shard.stat().st_size)


def test_damaged_newest_sharded_checkpoints_are_moved_aside_and_the_gang_resumes_from_an_older_one(
    trainer,
) -> None:
    """Step 18 has a short shard (verification refuses it before any rank reads it); step 12 has one
    of the right size full of garbage (only the load tells, on every rank alike). The gang resumes
    from step 6, both are moved aside, and the run ends where the undamaged one did."""
    spec = _gpt_tensor_spec()
    first = trainer.run(spec, world=2, job="dcp")
    root = first.checkpoint_dir
    assert [s for s, p in sc.list_checkpoints(root) if sc.is_sharded_checkpoint(p)] == [6, 12, 18]
    _truncate_shard(root / ckpt.name_for(18))
    _garbage_in_shard(root / ckpt.name_for(12))
    again = trainer.run(spec, world=2, job="dcp")
    assert again.summary["resumedFromStep"] == 6, again.outputs[0][-3000:]
    assert abs(again.summary["finalLoss"] - first.summary["finalLoss"]) < 1e-5  # the same steps 7..18 again
    for step in (12, 18):
        assert (root / f"{ckpt.name_for(step)}.corrupt").is_dir()  # kept for a human, not deleted
        assert sc.verify(root / ckpt.name_for(step)) is None  # written again, complete
    assert again.outputs[0].count("moved aside") == 2, again.outputs[0][-3000:]
