"""What every mode shares at the end of a run: held-out evaluation, the loss it trains with, the
summary (summary.json and the container's termination message) and the finished marker.

Every mode (disttrain_trainer.modes) imports this module; it imports no mode. The summary's
time categories are defined once in telemetry (sink.time_fractions, step_metrics.Tally).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .datasets import Dataset
from .process.config import SUMMARY_FILE, TrainerConfig, finished_path
from .process.precision import Amp
from .telemetry.scaling_record import termination_message

EVAL_BATCH = 512
# evaluate() names its figure like the metrics log does; the summary speaks the API's camelCase.
SUMMARY_EVAL_KEY = {"test_accuracy": "testAccuracy", "val_loss": "valLoss"}

# A run's summary: camelCase keys, as the job's status.result shows them.
Summary = dict[str, Any]


def loss_fn_for(ds: Dataset):  # noqa: ANN201
    if ds.kind == "lm":
        return lambda logits, y: F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]), y.reshape(-1)
        )
    return lambda logits, y: F.cross_entropy(logits.float(), y)


@torch.no_grad()
@torch.compiler.set_stance("force_eager")
def evaluate(model: nn.Module, ds: Dataset, amp: Amp) -> tuple[str, float]:
    """Test accuracy (classification) or validation loss (text) of the full held-out set.

    A model with vocabulary-sharded logits (tensor parallel) runs this under loss_parallel
    (modes/data/loop.py); every other model is a plain module here. Compiled blocks
    (training.compile) run eagerly here: evaluation's batch and no-grad mode would otherwise
    compile another graph, at every evaluation's shapes, for a pass that runs a few times a run."""
    was_training = model.training
    model.eval()
    x_all, y_all = ds.test_batches()
    correct, loss_sum, count = 0, 0.0, 0
    for i in range(0, len(x_all), EVAL_BATCH):
        x = torch.from_numpy(np.asarray(x_all[i : i + EVAL_BATCH])).to(amp.device)
        y = torch.from_numpy(np.asarray(y_all[i : i + EVAL_BATCH])).to(amp.device)
        with amp.autocast():
            logits = model(x).float()
        if ds.kind == "lm":
            loss_sum += float(
                F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
            )
            count += y.numel()
        else:
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
    model.train(was_training)
    return ("val_loss", loss_sum / count) if ds.kind == "lm" else ("test_accuracy", correct / count)


def mark_finished(cfg: TrainerConfig, rank: int, step: int) -> None:
    """Tell the launcher this rank is done, so an abort while exiting is not mistaken for a failure."""
    path = finished_path(cfg.run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": step, "restartAttempt": cfg.restart_attempt}))


def write_summary(cfg: TrainerConfig, summary: Summary) -> None:
    text = json.dumps(summary, indent=2, sort_keys=True)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = cfg.run_dir / (SUMMARY_FILE + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, cfg.run_dir / SUMMARY_FILE)
    if cfg.termination_log is not None:
        write_termination_message(cfg.termination_log, summary)


def write_termination_message(path: Path, summary: Summary) -> None:
    """The summary as the container's termination message (the operator's status.result)."""
    try:
        Path(path).write_text(termination_message(summary))
    except OSError as e:  # the summary.json is still there; a missing termination log is not fatal
        print(f"disttrain-trainer: cannot write termination log {path}: {e}", flush=True)
