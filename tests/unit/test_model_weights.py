"""model.init (weights/initial.py) from every source it reads, its strict and lenient matching and its
errors on real damaged files; the export (weights/export.py) and its atomic replacement; the
factory contract of models.call_factory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from disttrain_api import constants as C
from disttrain_api.model import parse_spec
from disttrain_trainer.checkpoints import sharded as sharded_ckpt
from disttrain_trainer.checkpoints import whole as whole_ckpt
from disttrain_trainer.data import Dataset, load_dataset
from disttrain_trainer.models import build_model
from disttrain_trainer.parallel.blocks import block_state, split_blocks
from disttrain_trainer.process.config import ConfigError
from disttrain_trainer.weights.export import TMP_PREFIX, write_export
from safetensors.torch import save_file


def spec_of(**model: Any) -> Any:
    return parse_spec({"mode": "data", "model": {"name": "mlp", "hidden": 16, "layers": 3, **model},
                       "data": {"name": "digits", "batchSize": 32, "seed": 1}})  # fmt: skip


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_dataset(spec_of(), tmp_path_factory.mktemp("data"))


def trained_state(digits: Dataset, seed: int = 7) -> dict[str, torch.Tensor]:
    """Weights unlike the seed-1 initialisation build_model gives: what a run would have trained."""
    torch.manual_seed(seed)
    model = build_model(spec_of(), digits)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return {n: t.clone() for n, t in model.state_dict().items()}


def assert_same(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    assert set(own) == set(state)
    for n, t in state.items():
        assert torch.equal(own[n], t), n


def test_init_from_a_safetensors_file_and_an_export_directory(tmp_path: Path, digits: Dataset) -> None:
    state = trained_state(digits)
    save_file(state, str(tmp_path / "w.safetensors"))
    assert_same(build_model(spec_of(init=str(tmp_path / "w.safetensors")), digits), state)
    entry = write_export(tmp_path / "ckpt", state, spec=spec_of(), step=5)
    assert entry["path"] == str(tmp_path / "ckpt" / C.EXPORT_DIRNAME) and entry["step"] == 5
    assert_same(build_model(spec_of(init=entry["path"]), digits), state)
    info = json.loads((Path(entry["path"]) / C.EXPORT_SPEC_FILENAME).read_text())
    assert info["model"]["name"] == "mlp" and info["step"] == 5


def test_init_from_whole_sharded_and_pipeline_checkpoints(tmp_path: Path, digits: Dataset) -> None:
    state = trained_state(digits)
    model = build_model(spec_of(), digits)
    model.load_state_dict(state)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    whole_ckpt.save(tmp_path / "whole", {"model": model.state_dict(), "step": 3}, 3, keep=2, world_size=1)
    sharded_ckpt.save(tmp_path / "dcp", 4, model=model, optimizer=opt, extra={"step": 4}, keep=2, layout="dp=1")
    blocks = split_blocks(model)
    pipe = {"blocks": block_state(blocks, range(len(blocks))), "step": 2}
    whole_ckpt.save(tmp_path / "pipe", pipe, 2, keep=2, world_size=2)
    for source in (tmp_path / "whole", tmp_path / "whole" / "step-00000003", tmp_path / "dcp", tmp_path / "pipe"):
        assert_same(build_model(spec_of(init=str(source)), digits), state)


def test_strict_mismatch_lists_missing_unexpected_and_misshapen_names(tmp_path: Path, digits: Dataset) -> None:
    state = trained_state(digits)
    state.pop("head.bias")
    state["extra.weight"] = torch.zeros(2)
    state["stem.0.weight"] = torch.zeros(3, 3)
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    with pytest.raises(ConfigError) as err:
        build_model(spec_of(init=str(path)), digits)
    msg = str(err.value)
    assert f"model.init {path} does not fit model mlp" in msg
    assert "missing 1 (head.bias)" in msg and "unexpected 1 (extra.weight)" in msg
    assert "stem.0.weight: [3, 3] in the file, [16, 64] in the model" in msg and "initStrict" in msg
    # Lenient: what fits is loaded, the rest keeps its initialisation.
    model = build_model(spec_of(init=str(path), initStrict=False), digits)
    fresh = build_model(spec_of(), digits)
    assert torch.equal(model.state_dict()["blocks.0.0.weight"], state["blocks.0.0.weight"])
    assert torch.equal(model.state_dict()["head.bias"], fresh.state_dict()["head.bias"])


def test_a_long_mismatch_is_cut_to_a_readable_length(tmp_path: Path, digits: Dataset) -> None:
    path = tmp_path / "other.safetensors"
    save_file({f"layer{i}.weight": torch.zeros(1) for i in range(40)}, str(path))
    with pytest.raises(ConfigError, match=r"unexpected 40 \(layer0.weight, .*\.\.\. 34 more\)") as err:
        build_model(spec_of(init=str(path)), digits)
    assert len(str(err.value)) < 800


def test_missing_truncated_and_foreign_files_name_the_path(tmp_path: Path, digits: Dataset) -> None:
    with pytest.raises(ConfigError, match=f"model.init {tmp_path / 'nope'}: no such file"):
        build_model(spec_of(init=str(tmp_path / "nope")), digits)
    path = tmp_path / "w.safetensors"
    save_file(trained_state(digits), str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # cut like a copy that did not finish
    with pytest.raises(ConfigError, match=f"model.init {path}: not a readable safetensors file"):
        build_model(spec_of(init=str(path)), digits)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither model.safetensors nor a complete disttrain checkpoint"):
        build_model(spec_of(init=str(tmp_path / "empty")), digits)


def test_a_damaged_checkpoint_is_refused_with_its_problem(tmp_path: Path, digits: Dataset) -> None:
    model = build_model(spec_of(), digits)
    res = whole_ckpt.save(tmp_path / "c", {"model": model.state_dict()}, 1, keep=2, world_size=1)
    state_file = res.path / whole_ckpt.STATE_FILE
    state_file.write_bytes(state_file.read_bytes()[:100])
    with pytest.raises(ConfigError, match="an incomplete or damaged checkpoint"):
        build_model(spec_of(init=str(res.path)), digits)


def test_export_replaces_the_previous_one_whole_and_clears_leftovers(tmp_path: Path, digits: Dataset) -> None:
    root = tmp_path / "ckpt"
    first, second = trained_state(digits, 1), trained_state(digits, 2)
    write_export(root, first, spec=spec_of(), step=1)
    (root / f"{TMP_PREFIX}killed").mkdir()  # a writer killed mid-export
    write_export(root, second, spec=spec_of(), step=2)
    exports = [p.name for p in root.iterdir() if p.name.startswith((TMP_PREFIX, C.EXPORT_DIRNAME))]
    assert exports == [C.EXPORT_DIRNAME]
    assert_same(build_model(spec_of(init=str(root / C.EXPORT_DIRNAME)), digits), second)


def not_a_module(spec, ds):  # noqa: ANN001, ANN201
    return {"weights": 1}


def wrong_signature(spec):  # noqa: ANN001, ANN201
    return torch.nn.Linear(1, 1)


def test_factory_contract_errors_name_the_factory(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match=rf"model.name '{__name__}:not_a_module' returned dict; .*nn.Module"):
        build_model(spec_of(name=f"{__name__}:not_a_module"), digits)
    with pytest.raises(ConfigError, match=rf"'{__name__}:wrong_signature': the factory must accept \(spec, dataset\)"):
        build_model(spec_of(name=f"{__name__}:wrong_signature"), digits)


def wrong_classes(spec, ds):  # noqa: ANN001, ANN201
    return torch.nn.Linear(ds.input_dim, 3)


def wrong_inputs(spec, ds):  # noqa: ANN001, ANN201
    return torch.nn.Linear(10, ds.num_classes)


def test_a_model_that_does_not_fit_the_data_is_refused_with_both_shapes(digits: Dataset) -> None:
    with pytest.raises(ConfigError, match=r"returns \[2, 3\] for a batch of shape \[2, 64\] of data digits; "
                                          r"the loss needs outputs of shape \[2, 10\]"):  # fmt: skip
        build_model(spec_of(name=f"{__name__}:wrong_classes"), digits)
    with pytest.raises(ConfigError, match=r"does not take data digits: a batch of shape \[2, 64\] \(torch.float32\) "
                                          r"fails in forward: RuntimeError"):  # fmt: skip
        build_model(spec_of(name=f"{__name__}:wrong_inputs"), digits)
