"""What every mode shares at the end of a run: held-out evaluation, the loss it trains with, the
summary (summary.json and the container's termination message) and the finished marker.

Every mode (disttrain_trainer.modes) imports this module; it imports no mode. The summary's
time categories are defined once in telemetry (sink.time_fractions, step_metrics.Tally).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .data import Dataset
from .losses import Loss, loss_fn
from .process.config import SUMMARY_FILE, TrainerConfig, finished_path
from .process.precision import Amp
from .telemetry.scaling_record import termination_message
from .telemetry.sink import MetricsSink

EVAL_BATCH = 512
# evaluate() names its figure like the metrics log does; the summary speaks the API's camelCase.
SUMMARY_EVAL_KEY = {"test_accuracy": "testAccuracy", "val_loss": "valLoss"}

# A run's summary: camelCase keys, as the job's status.result shows them.
Summary = dict[str, Any]


def loss_fn_for(ds: Dataset) -> Loss:
    """The loss a step minimises (losses.py: spec.training.loss)."""
    return loss_fn(ds)


@torch.no_grad()
@torch.compiler.set_stance("force_eager")
def evaluate(model: nn.Module, ds: Dataset, amp: Amp, rows: tuple[int, int] | None = None) -> tuple[str, float]:
    """Test accuracy (class labels) or the mean loss (token ids: cross-entropy per token; numeric
    labels: training.loss per row) of the full held-out set (of its rows lo..hi, `rows`: what
    probe_eval_seconds times).

    A model with vocabulary-sharded logits (tensor parallel) runs this under loss_parallel
    (modes/data/loop.py); every other model is a plain module here. Compiled blocks
    (training.compile) run eagerly here: evaluation's batch and no-grad mode would otherwise
    compile another graph, at every evaluation's shapes, for a pass that runs a few times a run."""
    was_training = model.training
    model.eval()
    x_all, y_all = ds.test_batches()
    lo, hi = rows if rows is not None else (0, len(x_all))
    correct, loss_sum, count = 0, 0.0, 0
    loss = loss_fn(ds)
    for i in range(lo, min(hi, len(x_all)), EVAL_BATCH):
        j = min(i + EVAL_BATCH, hi)
        x = torch.from_numpy(np.asarray(x_all[i:j])).to(amp.device)
        y = torch.from_numpy(np.asarray(y_all[i:j])).to(amp.device)
        with amp.autocast():
            logits = model(x).float()
        if ds.kind == "lm" and ds.loss == "cross_entropy":
            loss_sum += float(
                F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
            )
            count += y.numel()
        elif ds.kind == "lm" or ds.targets == "values":
            loss_sum += float(loss(logits, y)) * len(y)  # a mean over the batch, weighted by its rows
            count += len(y)
        else:
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
    model.train(was_training)
    count = max(1, count)  # an empty slice of rows (probe_eval_seconds at the set's end)
    if ds.kind == "lm" or ds.targets == "values":
        return "val_loss", loss_sum / count
    return "test_accuracy", correct / count


# probe_eval_seconds: batches timed after a warm-up one, and the most time they may take in all.
PROBE_MAX_BATCHES = 8
PROBE_MAX_S = 0.25


def probe_eval_seconds(model: nn.Module, ds: Dataset, amp: Amp,
                       evaluate_fn: Callable[..., tuple[str, float]] = evaluate) -> float:  # fmt: skip
    """Seconds a whole `evaluate` would take, from timing `evaluate` itself on a few of its
    batches after a warm-up one, scaled to every held-out row: at most about PROBE_MAX_S. The
    median batch counts, so a batch the OS preempted does not make the estimate.
    `evaluate_fn`: the mode's own (the data loop's runs under loss_parallel)."""
    n = len(ds.test_batches()[0])
    per_row: list[float] = []
    spent = 0.0
    for k in range(PROBE_MAX_BATCHES + 1):
        # Batches spread over the held-out set, as the evaluation reads it: rows next to each other
        # would sit in the CPU's caches and time a small model's evaluation several times too fast.
        lo = (k * n // (PROBE_MAX_BATCHES + 1)) // EVAL_BATCH * EVAL_BATCH
        hi = min(lo + EVAL_BATCH, n)
        if hi <= lo:
            return 0.0
        t0 = time.perf_counter()
        evaluate_fn(model, ds, amp, rows=(lo, hi))
        took = time.perf_counter() - t0
        if k:  # the first one warms up
            per_row.append(took / (hi - lo))
            spent += took
            if spent >= PROBE_MAX_S:
                break
    return float(np.median(per_row)) * n


def mark_finished(cfg: TrainerConfig, rank: int, step: int) -> None:
    """Tell the launcher this rank is done, so an abort while exiting is not mistaken for a failure."""
    path = finished_path(cfg.run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": step, "restartAttempt": cfg.restart_attempt}))


def write_summary(cfg: TrainerConfig, summary: Summary, sink: MetricsSink | None = None) -> None:
    """summary.json, the termination message, and the summary for the trackers of `sink` (the
    tracking process's metrics sink: they log it when it closes)."""
    if sink is not None:
        sink.finished(summary)
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
