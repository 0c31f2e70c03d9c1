"""A Hugging Face causal LM (model.name hf:<dir>, a tiny random GPT-2 saved in tmp_path) through
real trainer processes on gloo: 2 ranks DDP on a token file and 2 ranks FSDP2 on a tokenized
parquet text column; each export is a Hugging Face directory that from_pretrained loads, equal to
the final checkpoint's parameters; a run resumed at another world size ends where the
uninterrupted one does; parameter-server workers train one (disttrain local); a pipeline job is
refused with exit 2 before training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from disttrain_api import exitcodes
from disttrain_trainer.checkpoints import whole as ckpt
from disttrain_trainer.weights.initial import open_source
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_tiny  # tests/hf_tiny.py: tests/conftest.py puts tests/ on sys.path

STEPS = 4


def hf_spec(model: Path, data: dict[str, Any], **parallelism: Any) -> dict[str, Any]:
    return {
        "mode": "data",
        "parallelism": parallelism,
        "model": {"name": f"hf:{model}", "blockSize": 16},
        "data": {"batchSize": 8, "seed": 1, **data},
        "optimizer": {"name": "adamw", "lr": 0.003, "scaleLR": "none", "decay": "none"},
        "training": {"steps": STEPS, "logIntervalSteps": 2},
        "checkpoint": {"intervalSteps": 2, "keep": 3},
    }


def exported(result: Any) -> torch.nn.Module:
    entry = result.summary["export"]
    assert entry["weights"] == "model.safetensors" and entry["step"] == STEPS
    return AutoModelForCausalLM.from_pretrained(entry["path"], local_files_only=True)


def assert_equal(model: torch.nn.Module, final: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    assert set(final) == set(own)
    for n, t in final.items():
        assert torch.equal(own[n], t), n


def test_ddp_on_a_token_file_exports_a_loadable_directory_and_resumes_at_1_rank(trainer, tmp_path: Path) -> None:  # noqa: ANN001
    gpt2 = hf_tiny.save_gpt2(tmp_path / "gpt2")
    spec = hf_spec(gpt2, {"path": str(hf_tiny.write_tokens(tmp_path / "corpus")), "format": "tokens"})
    ref = trainer.run(spec, world=2, job="ddp")
    final = ckpt.load(ref.checkpoint_dir, STEPS)["model"]
    assert set(final) >= {"transformer.wte.weight", "lm_head.weight", "transformer.h.1.mlp.c_fc.weight"}
    start = AutoModelForCausalLM.from_pretrained(str(gpt2), local_files_only=True).state_dict()
    assert not torch.equal(final["transformer.h.0.attn.c_attn.weight"], start["transformer.h.0.attn.c_attn.weight"])
    assert_equal(exported(ref), final)
    # Resume from step 2 at world size 1: the same global batches, the same final parameters.
    target = trainer.ckpt_root / "one"
    target.mkdir(parents=True)
    shutil.copytree(ref.checkpoint_dir / ckpt.name_for(2), target / ckpt.name_for(2))
    one = trainer.run(spec, world=1, job="one")
    assert one.summary["resumedFromStep"] == 2
    resumed = ckpt.load(one.checkpoint_dir, STEPS)["model"]
    assert max(float((resumed[k] - final[k]).abs().max()) for k in final) < 1e-5


def test_fsdp2_on_a_tokenized_text_column_exports_model_and_tokenizer(trainer, tmp_path: Path) -> None:  # noqa: ANN001
    gpt2 = hf_tiny.save_gpt2(tmp_path / "gpt2")
    tok = hf_tiny.save_tokenizer(tmp_path / "tok")
    pq.write_table(pa.table({"text": hf_tiny.sentences(120)}), tmp_path / "text.parquet")
    data = {"path": str(tmp_path / "text.parquet"), "format": "parquet", "textColumn": "text", "tokenizer": str(tok)}
    run = trainer.run(hf_spec(gpt2, data, dataStrategy="fsdp"), world=2, job="fsdp")
    step_dir = run.checkpoint_dir / ckpt.name_for(STEPS)
    source = open_source(step_dir, torch.nn.Module())  # the sharded (DCP) checkpoint, read whole
    final = source.read(list(source.shapes))
    model = exported(run)
    assert_equal(model, {n: t for n, t in final.items() if n in model.state_dict()})
    export = Path(run.summary["export"]["path"])
    assert AutoTokenizer.from_pretrained(str(export), local_files_only=True)("the quick fox")["input_ids"] == \
        AutoTokenizer.from_pretrained(str(tok), local_files_only=True)("the quick fox")["input_ids"]  # fmt: skip


def test_a_pipeline_of_an_hf_model_is_refused_with_exit_2(trainer, tmp_path: Path) -> None:  # noqa: ANN001
    gpt2 = hf_tiny.save_gpt2(tmp_path / "gpt2")
    spec = hf_spec(gpt2, {"path": str(hf_tiny.write_tokens(tmp_path / "corpus")), "format": "tokens"}, pipeline=2)
    spec["mode"] = "pipeline"
    bad = trainer.run(spec, world=2, job="pp", expect_ok=False)
    assert set(bad.returncodes) == {exitcodes.CONFIG}, bad.returncodes
    assert "pipeline cannot train model hf:" in "\n".join(bad.outputs)


PARAMSERVER = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: hf-ps}
spec:
  mode: paramserver
  workers: {replicas: 2}
  model: {name: "hf:gpt2", blockSize: 16}
  data: {path: corpus, format: tokens, batchSize: 8, seed: 1}
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, decay: none}
  training: {steps: 4}
  paramServer: {maxStaleness: 2, shards: 1}
  checkpoint: {intervalSteps: 10, keep: 2}
"""


@pytest.mark.slow
def test_parameter_server_workers_train_an_hf_model_beside_the_manifest(tmp_path: Path) -> None:
    """disttrain local: the model directory and the corpus resolve beside the manifest; worker 0's
    export (the servers' final parameters) is a Hugging Face directory."""
    hf_tiny.save_gpt2(tmp_path / "gpt2")
    hf_tiny.write_tokens(tmp_path / "corpus")
    (tmp_path / "job.yaml").write_text(PARAMSERVER)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "disttrain_cli", "local", str(tmp_path / "job.yaml"), "--run-dir", str(run_dir),
           "--no-progress", "--metrics-port", "0"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(summary["export"]["path"], local_files_only=True)
    start = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gpt2"), local_files_only=True)
    assert not torch.equal(model.transformer.h[0].attn.c_attn.weight, start.transformer.h[0].attn.c_attn.weight)
