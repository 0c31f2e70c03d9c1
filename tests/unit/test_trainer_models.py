"""Model registry, import-path factories, and activation checkpointing (same gradients as none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.models import GPT, MODELS, build_model, resolve
from disttrain_trainer.parallel.activation_checkpointing import segment_size
from disttrain_trainer.process.config import ConfigError


def my_factory(spec, ds):  # noqa: ANN001, ANN201 - used through "module:factory" below
    return torch.nn.Linear(ds.input_dim, ds.num_classes)


def test_registry_and_import_path(tmp_path: Path) -> None:
    assert set(MODELS) == {"mlp", "cnn", "gpt"}
    assert resolve(f"{__name__}:my_factory") is my_factory
    with pytest.raises(ConfigError, match="cannot import"):
        resolve("no_such_module_xyz:f")


@pytest.mark.parametrize("n,policy,size", [(4, "none", 0), (9, "sqrt", 3), (10, "sqrt", 4), (16, "sqrt", 4),
                                            (5, "every:2", 2), (1, "sqrt", 1)])  # fmt: skip
def test_segment_sizes(n: int, policy: str, size: int) -> None:
    assert segment_size(policy, n) == size


def grads(spec_dict: dict, tmp: Path, policy: str) -> dict[str, torch.Tensor]:
    spec_dict = {**spec_dict, "training": {"activationCheckpointing": policy}}
    spec = parse_spec(spec_dict)
    ds = load_dataset(spec, tmp)
    model = build_model(spec, ds)
    x, y = ds.batch(torch.arange(8).numpy())
    out = model(torch.from_numpy(x))
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.from_numpy(y).reshape(-1))
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "spec",
    [
        {"model": {"name": "mlp", "hidden": 16, "layers": 6}, "data": {"name": "digits"}},
        {"model": {"name": "cnn", "hidden": 8, "layers": 4}, "data": {"name": "digits"}},
        {
            "model": {"name": "gpt", "hidden": 32, "layers": 4, "heads": 4, "blockSize": 16},
            "data": {"name": "pytext"},
        },
    ],
    ids=["mlp", "cnn", "gpt"],
)
def test_activation_checkpointing_gives_the_same_gradients(spec: dict, tmp_path: Path) -> None:
    ref = grads(spec, tmp_path, "none")
    for policy in ("sqrt", "every:1", "every:3"):
        got = grads(spec, tmp_path, policy)
        assert got.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-6, msg=f"{policy}: {k}")


def test_checkpointing_really_recomputes(tmp_path: Path) -> None:
    """Every block starts its forward twice under checkpointing: the recomputation happens.

    (Pre-hooks: non-reentrant checkpointing stops a recomputation as soon as it has the
    saved tensors it needs, so a block's post-forward hook may not fire the second time.)
    """
    spec = parse_spec({"model": {"name": "gpt", "hidden": 16, "layers": 4, "heads": 2, "blockSize": 8},
                       "data": {"name": "pytext"}, "training": {"activationCheckpointing": "sqrt"}})  # fmt: skip
    model = build_model(spec, load_dataset(spec, tmp_path))
    assert isinstance(model, GPT)
    calls = []
    for b in model.blocks:
        b.register_forward_pre_hook(lambda *_: calls.append(1))
    model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
    assert len(calls) == 8


def test_model_data_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    spec = parse_spec({"model": {"name": "gpt"}, "data": {"name": "digits"}})
    with pytest.raises(ConfigError, match="model.name gpt needs a text dataset"):
        build_model(spec, load_dataset(spec, tmp_path))
