"""Hugging Face models (model.name hf:<dir>) and tokenized text columns, on a tiny random GPT-2 and
a word-level tokenizer built in tmp_path (nothing is downloaded): loading and its errors, the
adapter's names and FSDP units, token ids against the model's vocabulary, the tokenizer's errors,
the Hugging Face export and model.init from a Hugging Face directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import hf_tiny  # tests/hf_tiny.py: tests/conftest.py puts tests/ on sys.path
import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json  # noqa: F401 - registers pyarrow.json for the jsonl reader
import pyarrow.parquet as pq
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_api.validation import validate_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.hf_models import HFCausalLM
from disttrain_trainer.models import build_model
from disttrain_trainer.parallel.fsdp import units
from disttrain_trainer.process.config import ConfigError
from disttrain_trainer.weights.export import write_export
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    hf_tiny.save_gpt2(root / "gpt2")
    hf_tiny.save_tokenizer(root / "tok")
    hf_tiny.write_tokens(root / "corpus")
    pq.write_table(pa.table({"text": hf_tiny.sentences(60), "n": list(range(60))}), root / "text.parquet")
    (root / "text.jsonl").write_text("".join(json.dumps({"body": s}) + "\n" for s in hf_tiny.sentences(40, seed=1)))
    table = pa.table({"text": hf_tiny.sentences(60), "n": list(range(60))})
    pa_csv.write_csv(table, root / "text.csv")
    datasets.Dataset(table).save_to_disk(str(root / "text.hfdataset"))
    return root


def spec_of(model: str, data: dict[str, Any], **top: Any) -> Any:
    return parse_spec({"mode": "data", "model": {"name": f"hf:{model}", "blockSize": 16},
                       "data": {"batchSize": 4, **data}, **top})  # fmt: skip


def tokens_spec(art: Path, model: Path | None = None, **model_over: Any) -> Any:
    spec = spec_of(str(model or art / "gpt2"), {"path": str(art / "corpus"), "format": "tokens"})
    if model_over:
        import dataclasses

        spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, **model_over))
    return spec


def build(spec: Any, cache: Path) -> torch.nn.Module:
    return build_model(spec, load_dataset(spec, cache))


def test_an_hf_model_loads_with_its_own_names_and_computes_its_logits(art: Path, tmp_path: Path) -> None:
    model = build(tokens_spec(art), tmp_path)
    assert isinstance(model, HFCausalLM)
    ref = AutoModelForCausalLM.from_pretrained(str(art / "gpt2"), local_files_only=True)
    assert set(model.state_dict()) == set(ref.state_dict())
    for n, t in ref.state_dict().items():
        assert torch.equal(model.state_dict()[n], t), n
    x = torch.randint(0, hf_tiny.VOCAB, (2, 16))
    model.eval()
    ref.eval()
    assert torch.allclose(model(x), ref(input_ids=x).logits, atol=1e-6)
    # FSDP2's units: the transformer blocks (GPT-2's _no_split_modules), found without a `blocks` attribute.
    assert [type(u).__name__ for u in units(model)] == ["GPT2Block", "GPT2Block"]
    model.train()
    assert model.hf.training and model.transformer.h[0].training


def test_a_missing_directory_config_or_weights_is_a_config_error(art: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        build(tokens_spec(art, tmp_path / "nowhere"), tmp_path / "c")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes((art / "gpt2" / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"has no config\.json; save the model with save_pretrained"):
        build(tokens_spec(art, bare), tmp_path / "c")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((art / "gpt2" / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ConfigError, match=r"has no safetensors weights .*pytorch_model\.bin are not read"):
        build(tokens_spec(art, pickled), tmp_path / "c")


def test_a_damaged_config_or_weights_that_do_not_fit_are_config_errors(art: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((art / "gpt2" / "config.json").read_text()[:40])  # truncated JSON
    (broken / "model.safetensors").write_bytes((art / "gpt2" / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"config\.json is not a config transformers can read"):
        build(tokens_spec(art, broken), tmp_path / "c")

    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "config.json").write_text((art / "gpt2" / "config.json").read_text())
    tensors = load_file(str(art / "gpt2" / "model.safetensors"))
    tensors["transformer.extra.weight"] = tensors.pop("transformer.ln_f.weight")
    save_file(tensors, str(renamed / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError) as e:
        build(tokens_spec(art, renamed), tmp_path / "c")
    assert "do not fit its config.json" in str(e.value)
    assert "missing 1 (transformer.ln_f.weight)" in str(e.value)
    assert "unexpected 1 (transformer.extra.weight)" in str(e.value)

    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text((art / "gpt2" / "config.json").read_text())
    (truncated / "model.safetensors").write_bytes((art / "gpt2" / "model.safetensors").read_bytes()[:-100])
    with pytest.raises(ConfigError, match=str(truncated)):
        build(tokens_spec(art, truncated), tmp_path / "c")


def test_block_size_past_the_models_positions_is_refused(art: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"model.blockSize 40 exceeds the {hf_tiny.POSITIONS} positions"):
        build(tokens_spec(art, block_size=40), tmp_path)


def test_token_ids_past_the_models_vocabulary_are_refused(art: Path, tmp_path: Path) -> None:
    small = hf_tiny.save_gpt2(tmp_path / "small", vocab=64)  # the corpus holds ids up to 127
    with pytest.raises(ConfigError, match=r"holds token id 127, outside the vocabulary of model hf:.*small \(64\)"):
        load_dataset(tokens_spec(art, small), tmp_path / "c")
    # Every id fits: the data's vocabulary is the model's, whatever the largest id.
    assert load_dataset(tokens_spec(art), tmp_path / "c").num_classes == hf_tiny.VOCAB


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "hfdataset"])
def test_a_text_column_is_tokenized_once_into_a_token_stream(art: Path, tmp_path: Path, fmt: str) -> None:
    column = "body" if fmt == "jsonl" else "text"
    spec = spec_of(str(art / "gpt2"), {"path": str(art / f"text.{fmt}"), "format": fmt, "textColumn": column,
                                       "tokenizer": str(art / "tok")})  # fmt: skip
    ds = load_dataset(spec, tmp_path)
    assert ds.kind == "lm" and ds.num_classes == hf_tiny.VOCAB
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(art / "tok"))
    first = (hf_tiny.sentences(40, seed=1) if fmt == "jsonl" else hf_tiny.sentences(60))[0]
    expected = [*tok(first, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    (entry,) = [p for p in tmp_path.glob("text-*") if p.is_dir()]
    stream = np.fromfile(entry / "tokens.bin", dtype=np.uint16)
    assert stream[: len(expected)].tolist() == expected
    mtime = (entry / "tokens.bin").stat().st_mtime_ns
    load_dataset(spec, tmp_path)  # converted once: the cache entry is reused
    assert (entry / "tokens.bin").stat().st_mtime_ns == mtime
    model = build_model(spec, ds)
    x, _ = ds.batch(np.arange(2))
    assert model(torch.from_numpy(x)).shape == (2, 16, hf_tiny.VOCAB)


def test_a_missing_text_column_or_an_unreadable_tokenizer_is_a_config_error(art: Path, tmp_path: Path) -> None:
    base = {"path": str(art / "text.parquet"), "format": "parquet", "tokenizer": str(art / "tok")}
    with pytest.raises(ConfigError, match=r"spec.data.textColumn: .*text.parquet has no column 'body' \(it has text, n\)"):
        load_dataset(spec_of(str(art / "gpt2"), {**base, "textColumn": "body"}), tmp_path)
    with pytest.raises(ConfigError, match="column 'n' of .* is int64, not text"):
        load_dataset(spec_of(str(art / "gpt2"), {**base, "textColumn": "n"}), tmp_path)
    with pytest.raises(ConfigError, match="spec.data.tokenizer: .*nowhere is not a directory"):
        load_dataset(spec_of(str(art / "gpt2"), {**base, "textColumn": "text", "tokenizer": str(tmp_path / "nowhere")}),
                     tmp_path)  # fmt: skip
    empty = tmp_path / "empty-tok"
    empty.mkdir()
    (empty / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="spec.data.tokenizer: .*empty-tok is not a readable Hugging Face tokenizer"):
        load_dataset(spec_of(str(art / "gpt2"), {**base, "textColumn": "text", "tokenizer": str(empty)}), tmp_path)


def test_the_export_is_a_hugging_face_directory_and_model_init_reads_one(art: Path, tmp_path: Path) -> None:
    spec = spec_of(str(art / "gpt2"), {"path": str(art / "text.parquet"), "format": "parquet", "textColumn": "text",
                                       "tokenizer": str(art / "tok")})  # fmt: skip
    model = build(spec, tmp_path / "c")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)  # unlike the directory's weights: what a run would have trained
    entry = write_export(tmp_path / "ckpt", model.state_dict(), spec=spec, step=3)
    out = Path(entry["path"])
    assert entry["weights"] == "model.safetensors"
    assert {"config.json", "model.safetensors", "model.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    for n, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[n], t), n
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))  # tied: stored once
    # model.init from that directory, strict: the tied head is found through the embedding.
    again = build(tokens_spec(art, init=str(out)), tmp_path / "c")
    for n, t in model.state_dict().items():
        assert torch.equal(again.state_dict()[n], t), n
    assert again.lm_head.weight is again.transformer.wte.weight


def errors_of(spec: dict[str, Any]) -> str:
    return "\n".join(str(e) for e in validate_spec(parse_spec(spec)))


def test_validation_refuses_what_an_hf_model_cannot_train_with() -> None:
    data = {"path": "corpus", "format": "tokens", "batchSize": 8}
    model = {"name": "hf:/models/gpt2", "blockSize": 16}
    base = {"workers": {"replicas": 2}, "model": model, "data": data}
    assert errors_of({"mode": "data", **base}) == ""
    assert errors_of({"mode": "data", "parallelism": {"dataStrategy": "fsdp"}, **base}) == ""
    assert "pipeline cannot train model hf:/models/gpt2" in errors_of({"mode": "pipeline", **base,
                                                                       "parallelism": {"pipeline": 2}})  # fmt: skip
    assert "no tensor-parallel plan for Hugging Face models" in errors_of({"mode": "tensor", **base,
                                                                          "parallelism": {"tensor": 2}})  # fmt: skip
    assert "federated cannot train model hf:/models/gpt2" in errors_of({"mode": "federated", **base})
    assert errors_of({"mode": "paramserver", **base}) == ""
    assert "reads token ids of its own tokenizer" in errors_of({"mode": "data", **base, "data": {"name": "pytext"}})
    assert "activationCheckpointing" in errors_of({"mode": "data", **base, "training": {"activationCheckpointing": "sqrt"}})
    text = {"path": "t.parquet", "format": "parquet", "textColumn": "text"}
    assert "spec.data.tokenizer: required with textColumn" in errors_of({"mode": "data", **base, "data": text})
    assert errors_of({"mode": "data", **base, "data": {**text, "tokenizer": "tok"}}) == ""
    assert "textColumn: only read with format parquet, jsonl, csv, hfdataset, not npy" in errors_of(
        {"mode": "data", "data": {"path": "d", "format": "npy", "textColumn": "t", "tokenizer": "tok"}})
    assert "not both" in errors_of({"mode": "data", "data": {**text, "tokenizer": "tok", "featureColumns": ["a"]}})
    assert "a text column does not fit model mlp" in errors_of({"mode": "data", "data": {**text, "tokenizer": "tok"}})
    assert errors_of({"mode": "data", "model": {"name": "gpt"}, "data": {**text, "tokenizer": "tok"}}) == ""


def test_disttrain_local_resolves_the_model_and_tokenizer_dirs_against_the_manifest_folder(tmp_path: Path) -> None:
    import yaml
    from disttrain_cli.local_cmd import load_manifest

    job = {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "hf"},
           "spec": {"mode": "data", "model": {"name": "hf:models/gpt2"},
                    "data": {"path": "t.parquet", "format": "parquet", "textColumn": "text", "tokenizer": "tok"}}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    parsed, problems = load_manifest(str(tmp_path / "job.yaml"))
    assert problems == []
    assert parsed.spec.model.name == f"hf:{tmp_path / 'models' / 'gpt2'}"
    assert parsed.spec.data.tokenizer == str(tmp_path / "tok")
    job["spec"]["model"]["name"] = "hf:/abs/gpt2"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert load_manifest(str(tmp_path / "job.yaml"))[0].spec.model.name == "hf:/abs/gpt2"


def test_the_builtin_gpt_trains_on_a_tokenized_text_column_with_the_tokenizers_vocabulary(art: Path, tmp_path: Path) -> None:
    spec = parse_spec({"mode": "data", "model": {"name": "gpt", "hidden": 16, "layers": 1, "heads": 2, "blockSize": 8},
                       "data": {"path": str(art / "text.parquet"), "format": "parquet", "textColumn": "text",
                                "tokenizer": str(art / "tok"), "batchSize": 4}})  # fmt: skip
    ds = load_dataset(spec, tmp_path)
    from transformers import AutoTokenizer

    assert ds.num_classes == len(AutoTokenizer.from_pretrained(str(art / "tok")))
    x, _ = ds.batch(np.arange(2))
    assert build_model(spec, ds)(torch.from_numpy(x)).shape == (2, 8, ds.num_classes)


def test_a_directory_of_parquet_files_is_streamed_and_empty_texts_are_refused(art: Path, tmp_path: Path) -> None:
    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(pa.table({"text": hf_tiny.sentences(30)}), folder / "a.parquet")
    pq.write_table(pa.table({"text": hf_tiny.sentences(30, seed=2)}), folder / "b.parquet")
    data = {"path": str(folder), "format": "parquet", "textColumn": "text", "tokenizer": str(art / "tok")}
    assert load_dataset(spec_of(str(art / "gpt2"), data), tmp_path / "c").num_train > 100
    pq.write_table(pa.table({"text": ["the dog", None]}), folder / "c.parquet")
    with pytest.raises(ConfigError, match="column 'text' of .*parts/c.parquet has empty values"):
        load_dataset(spec_of(str(art / "gpt2"), data), tmp_path / "c")
