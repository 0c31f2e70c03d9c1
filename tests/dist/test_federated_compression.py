"""Compressed updates (int8, top-k with error feedback) reach the accuracy of uncompressed ones
after the same rounds on non-IID digits, with far fewer bytes on the wire."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
import torch
import yaml

from disttrain_api.model import parse_spec
from disttrain_trainer.process.config import config_for
from disttrain_trainer.data import load_dataset
from disttrain_trainer.modes.federated import inprocess
from disttrain_trainer.modes.federated.entry import client_states, make_evaluator
from disttrain_trainer.modes.federated.settings import client_ids
from disttrain_trainer.tensor_transport import auth

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.dist


# One server key and sampling salt for every run: they sample the very same clients each round.
KEY, SALT = auth.new_key(), secrets.token_bytes(32)


def _run(tmp_path: Path, **fed: object) -> tuple[float, int]:
    raw = yaml.safe_load((ROOT / "manifests" / "examples" / "federated.yaml").read_text())["spec"]
    raw["federated"].update({"secureAggregation": False, "rounds": 20, **fed})
    spec = parse_spec(raw)
    torch.set_num_threads(1)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=tmp_path, checkpoint_root=tmp_path)
    states = client_states(cfg, ds, client_ids(spec.federated.clients))
    run = asyncio.run(inprocess.run_job(spec, ds, [states[0::2], states[1::2]], key=KEY, sampling_salt=SALT,
                                        evaluate=make_evaluator(cfg, ds)))  # fmt: skip
    h = run.aggregator.history
    assert len(h) == 20
    return h[-1]["test_accuracy"], sum(r["bytes_up"] for r in h)


def test_int8_and_topk_stay_within_one_point_of_uncompressed(tmp_path: Path) -> None:
    base_acc, base_bytes = _run(tmp_path, compression="none")
    int8_acc, int8_bytes = _run(tmp_path, compression="int8")
    topk_acc, topk_bytes = _run(tmp_path, compression="topk", topkRatio=0.1)
    assert base_acc >= 0.9
    assert abs(int8_acc - base_acc) <= 0.01 and abs(topk_acc - base_acc) <= 0.01, (base_acc, int8_acc, topk_acc)
    # Measured bytes on the wire: int8 ~1/4 of fp32; top-10% sends index (8 B) + value (4 B) per kept entry.
    assert int8_bytes < 0.27 * base_bytes and topk_bytes < 0.32 * base_bytes, (base_bytes, int8_bytes, topk_bytes)
