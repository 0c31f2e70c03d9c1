"""No checkpoint is read with a loader that can run code: a planted pickle (whole state.pt, a
sharded checkpoint's extra.pt or DCP metadata, model.init, a peer's per-rank part) is refused unread,
named in the error, and the writer moves it aside and resumes from the checkpoint before; what the
trainer saves (numpy RNG state included) is plain enough to load back exactly."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from disttrain_trainer.checkpoints import convert, fence, rank_state, safe_state
from disttrain_trainer.checkpoints import directory as cdir
from disttrain_trainer.checkpoints import sharded as sc
from disttrain_trainer.checkpoints import whole as ckpt
from disttrain_trainer.process.config import ConfigError
from disttrain_trainer.weights import initial

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Payload:
    """Unpickled with the standard loader, this creates `target`: proof the file's code ran."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.target, "code ran"))


def plant(root: Path, step: int, target: Path, writer: fence.Writer) -> Path:
    """A forged checkpoint as a hostile pod with write access would leave it: a pickle payload in
    state.pt, a meta.json with the right manifest, and a fence claim after the newest one that names
    it as published, so the next claim carries it over and picks it."""
    path = root / cdir.name_for(step)
    path.mkdir()
    torch.save({"model": Payload(target), "step": step}, path / ckpt.STATE_FILE)
    newest = max(int(p.name) for p in (root / fence.FENCE_DIR).iterdir() if p.name.isdigit())
    record = {"jobUID": writer.job_uid, "attempt": writer.attempt, "generation": newest + 1}
    present = sorted(p.name for p in root.iterdir() if cdir.NAME.match(p.name))
    (root / fence.FENCE_DIR / f"{newest + 1:012d}").write_text(json.dumps({**record, "published": present}))
    meta = {"step": step, "world_size": 1, "format": ckpt.FORMAT, "files": cdir.manifest(path), "writer": record}
    (path / ckpt.META_FILE).write_text(json.dumps(meta))
    return path


def test_a_planted_whole_checkpoint_is_neither_run_nor_resumed_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, target, writer = tmp_path / "job", tmp_path / "pwned", fence.Writer(job_uid="uid-1", attempt=0)
    cdir.take_over(root, writer)
    ckpt.save(root, {"model": {"w": torch.ones(3)}, "step": 5}, 5, keep=3, world_size=1)
    plant(root, 99_999_999, target, writer)
    cdir.take_over(root, fence.Writer(job_uid="uid-1", attempt=1))  # the restarted writer
    step, state = ckpt.load_latest(root)  # type: ignore[misc]
    assert not target.exists(), "the planted pickle ran"
    assert step == 5 and torch.equal(state["model"]["w"], torch.ones(3))
    out = capsys.readouterr().out
    assert "step-99999999 is unreadable" in out and "refused unread" in out and "names getattr" in out, out
    assert (root / "step-99999999.corrupt").is_dir()  # kept for whoever investigates, never picked


def forge_manifest(path: Path) -> None:
    meta = json.loads((path / ckpt.META_FILE).read_text())
    (path / ckpt.META_FILE).write_text(json.dumps({**meta, "files": cdir.manifest(path)}))


def test_a_planted_sharded_checkpoint_and_model_init_are_refused_unread(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    model = torch.nn.Linear(4, 2)
    path = sc.save(tmp_path / "job", 3, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   extra={"step": 3}, keep=2, layout="dp=1,pp=1,tp=1").path  # fmt: skip
    assert sc.verify(path) is None
    good_metadata = (path / sc.DCP_METADATA).read_bytes()
    torch.save({"step": Payload(target)}, path / sc.EXTRA_FILE)
    forge_manifest(path)
    assert "refused unread" in (sc.verify(path) or "")
    with pytest.raises(safe_state.UnsafeCheckpoint, match="extra.pt"):
        sc.load(path, model=model, optimizer=None)
    (path / sc.DCP_METADATA).write_bytes(pickle.dumps(Payload(target)))
    forge_manifest(path)
    assert "refused unread" in (sc.verify(path) or "")
    (path / sc.DCP_METADATA).write_bytes(good_metadata)
    forge_manifest(path)
    with pytest.raises(ConfigError, match="refused unread"):
        initial.open_source(path, model)
    planted = tmp_path / "init" / cdir.name_for(1)
    planted.mkdir(parents=True)
    torch.save({"model": {"weight": Payload(target)}}, planted / ckpt.STATE_FILE)
    (planted / ckpt.META_FILE).write_text(json.dumps({"step": 1, "format": 2, "files": cdir.manifest(planted)}))
    with pytest.raises(ConfigError, match=r"model.init .*state.pt.*refused unread"):
        initial.open_source(planted, model)
    assert not target.exists(), "a planted pickle ran"


def test_a_peers_planted_part_is_refused() -> None:
    with pytest.raises(safe_state.UnsafeCheckpoint, match="rank 1"):
        safe_state.loads(pickle.dumps(Payload(Path("/nonexistent/x")), protocol=2), "rank 1's checkpoint part")


def test_a_checkpoint_of_the_previous_format_is_refused_until_converted_by_someone_who_trusts_it(
    tmp_path: Path
) -> None:
    """disttrain before safe checkpoints pickled numpy's RNG state as arrays (meta.json format 1)."""
    np.random.seed(4)
    legacy_rng = np.random.get_state()
    expected = np.random.rand(3)
    path = tmp_path / cdir.name_for(7)
    path.mkdir()
    torch.save({"rng": [{"numpy": legacy_rng}], "loss": np.float64(0.25), "step": 7}, path / ckpt.STATE_FILE)
    (path / ckpt.META_FILE).write_text(json.dumps({"step": 7, "format": 1, "files": cdir.manifest(path)}))
    (tmp_path / "step-00000007.committed").write_text(json.dumps({"step": 7, "files": cdir.manifest(path)}))
    with pytest.raises(safe_state.UnsafeCheckpoint) as err:
        ckpt.load(tmp_path, 7)
    assert str(path / ckpt.STATE_FILE) in str(err.value) and "numpy" in str(err.value)
    assert "README" in str(err.value)
    assert convert.main([str(tmp_path)]) == 2  # unpickling in full needs the user's word
    assert convert.main(["--trust", str(tmp_path)]) == 0
    state = ckpt.load(tmp_path, 7)  # the manifest follows the rewritten file
    assert state["loss"] == 0.25 and json.loads((path / ckpt.META_FILE).read_text())["format"] == ckpt.FORMAT
    marker = json.loads((tmp_path / "step-00000007.committed").read_text())
    assert marker["files"] == cdir.manifest(path)
    rank_state.set_rng_state({"torch": torch.get_rng_state(), "python": random.getstate(), **state["rng"][0]})
    assert np.array_equal(np.random.rand(3), expected)
    assert convert.main(["--trust", str(path)]) == 0  # converting again changes nothing


def test_what_is_saved_is_plain_and_the_rng_streams_resume_exactly(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    saved = rank_state.rng_state()
    ckpt.save(tmp_path, {"rng": [saved], "loss": np.float32(0.5), "n": np.int64(3)}, 1, keep=1, world_size=1)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    _, state = ckpt.load_latest(tmp_path)  # type: ignore[misc]
    assert state["loss"] == 0.5 and type(state["n"]) is int
    rank_state.set_rng_state(state["rng"][0])
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_a_value_the_loader_would_refuse_is_refused_at_save_naming_its_key(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"state\['history'\]\[1\]: a numpy.ndarray cannot be saved"):
        ckpt.save(tmp_path, {"history": [1, np.zeros(2)]}, 1, keep=1, world_size=1)
    assert not ckpt.list_checkpoints(tmp_path)
