"""training.compile and training.float8 in the API (field, CRD schema, cross-field rules) and the
float8 conversion's choice of layers, checked without running a float8 matmul."""

from __future__ import annotations

import sys

import pytest
import torch
from disttrain_api.crd import openapi_schema, schema_errors, structural_problems
from disttrain_api.model import SpecError, parse_spec
from disttrain_api.validation import check_job
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel import float8
from disttrain_trainer.process.config import ConfigError
from torch import nn


def _errors(spec: dict) -> list[str]:
    obj = {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "x"}, "spec": spec}
    return [str(e) for e in check_job(obj)[1]]


@pytest.mark.parametrize(("value", "mode"), [(False, None), (True, "default"), ("default", "default"),
                                             ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_compile_takes_a_switch_or_a_mode(value: object, mode: str | None) -> None:
    assert parse_spec({"training": {"compile": value}}).training.compile_mode == mode


@pytest.mark.parametrize("value", ["fast", 1, "true"])
def test_compile_refuses_anything_else_naming_the_choices(value: object) -> None:
    with pytest.raises(SpecError, match=r"spec.training.compile: .* is not true, false or one of default, "
                                        r"max-autotune-no-cudagraphs"):  # fmt: skip
        parse_spec({"training": {"compile": value}})


def test_crd_takes_true_false_or_a_mode_and_stays_structural() -> None:
    schema = openapi_schema()
    node = schema["properties"]["spec"]["properties"]["training"]["properties"]["compile"]
    assert "type" not in node and node["x-kubernetes-preserve-unknown-fields"] is True
    assert node["default"] is False
    assert not structural_problems(schema)
    for ok in (True, False, "default", "max-autotune-no-cudagraphs"):
        assert schema_errors(ok, node, "compile") == []
    assert schema_errors("fast", node, "compile")


def test_rules_refuse_compile_and_float8_where_they_cannot_apply() -> None:
    assert _errors({"training": {"compile": True}}) == []
    assert _errors({"mode": "paramserver", "training": {"compile": True}}) == [
        "spec.training.compile: applies to modes data, tensor, hybrid, pipeline; mode paramserver trains in a loop of "
        "its own that does not compile (set compile: false)"]  # fmt: skip
    assert any("workers.resources.gpus is 0" in e for e in _errors({"training": {"float8": True}}))
    gpu = {"replicas": 2, "resources": {"gpus": 1}}
    assert _errors({"workers": gpu, "training": {"float8": True}, "parallelism": {"dataStrategy": "fsdp"}}) == []
    tensor = _errors({"mode": "tensor", "workers": gpu, "parallelism": {"tensor": 2}, "training": {"float8": True}})
    assert tensor and "tensor parallelism would need torchao's float8 tensor-parallel styles" in tensor[0]


def _gpt(dim: int, layers: int, heads: int) -> nn.Module:
    with torch.device("meta"):  # no memory, nothing run: only the shapes matter to the filter
        return GPT(vocab=50304, block_size=1024, dim=dim, layers=layers, heads=heads, dropout=0.0, act_ckpt="none")


def test_float8_filter_swaps_the_large_aligned_linears_and_never_the_head() -> None:
    # GPT-2 small (768): the qkv (768 -> 2304) and MLP up (768 -> 3072) projections; the attention
    # output and MLP down projections have <= 1024 outputs from <= 4096 inputs: left in high precision.
    small = float8.planned(_gpt(768, 2, 12))
    assert small == [f"blocks.{i}.{n}" for i in range(2) for n in ("attn.qkv", "mlp.0")]
    # The 1.3B shape (2048): every linear of a block; the vocabulary head still not.
    big = float8.planned(_gpt(2048, 1, 16))
    assert big == ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.0", "blocks.0.mlp.2"]
    odd = nn.Sequential(nn.Linear(4104, 2048), nn.Linear(8192, 1000), nn.Linear(8192, 2048))
    assert float8.planned(odd) == ["2"]  # 4104 inputs: not a multiple of 16; 1000 outputs: neither


def test_torchao_swaps_exactly_the_planned_linears() -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = _gpt(768, 2, 12)
    planned = float8.planned(model)
    assert float8.apply_float8(model, fsdp=True) == planned
    swapped = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert swapped == planned
    assert all(m.config.enable_fsdp_float8_all_gather for n, m in model.named_modules() if n in swapped)


def test_float8_without_large_linears_or_on_a_cpu_is_refused_naming_why() -> None:
    with pytest.raises(ConfigError, match="has no linear layer float8 would speed up"):
        float8.apply_float8(_gpt(64, 1, 4), fsdp=False, name="gpt")
    with pytest.raises(ConfigError, match="this process trains on cpu"):
        float8.check_device(torch.device("cpu"))


def test_float8_in_an_image_without_torchao_is_refused_naming_the_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail as a missing package does (ImportError).
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match=r"training.float8 needs torchao, which this image lacks .*disttrain\[trainer\]"):
        float8.apply_float8(_gpt(2048, 1, 16), fsdp=False, name="gpt")


def test_compile_wraps_each_block_in_place_and_keeps_parameter_names() -> None:
    from disttrain_trainer.parallel.block_compile import apply_compile

    model = GPT(vocab=29, block_size=8, dim=16, layers=3, heads=2, dropout=0.0, act_ckpt="none")
    names = list(model.state_dict())
    assert apply_compile(model, "default") == 3  # lazily: nothing compiles before the first forward
    assert list(model.state_dict()) == names  # no _orig_mod. prefix: checkpoints move between compiled and eager
    assert apply_compile(model, "default") == 3 and model.blocks[0]._disttrain_compiled
    with pytest.raises(ConfigError, match="has no blocks to compile one by one"):
        apply_compile(nn.Linear(4, 4), "default", name="mine:linear")
