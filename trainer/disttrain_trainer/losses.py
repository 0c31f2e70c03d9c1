"""training.loss: what a step minimises, and what the held-out evaluation reports.

cross_entropy: class logits against integer labels, or next-token logits against token ids.
mse: a regression on numeric labels; the model has one output per sample, (batch, 1).
'package.module:function': a loss of your own, loss(outputs, labels) -> a scalar tensor, imported
when the job starts and called on one batch before training (models.check_fits), so one that
cannot be imported, raises, or returns something else than one finite number is the job's config
(exit 2) instead of a crash at step 1.

The evaluation reports accuracy for class labels (whatever the loss), and the mean loss over the
held-out rows for numeric labels and token ids (`valLoss`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .data import Dataset
from .process.config import ConfigError

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BUILTIN = ("cross_entropy", "mse")


def _cross_entropy_lm(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), y)


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float().reshape(y.shape), y.float())


def user_loss(name: str) -> Loss:
    """The function 'package.module:function', imported now."""
    module, attr = name.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"training.loss {name!r}: cannot import ({e}); is the module installed in the image?") from None
    if not callable(fn):
        raise ConfigError(f"training.loss {name!r} is not callable; it must be loss(outputs, labels) -> a scalar tensor")
    return fn


def loss_fn(ds: Dataset) -> Loss:
    """The loss a step of this data minimises (ds.loss: spec.training.loss)."""
    if ds.loss == "cross_entropy":
        return _cross_entropy_lm if ds.kind == "lm" else _cross_entropy
    if ds.loss == "mse":
        return _mse
    return user_loss(ds.loss)


def check(ds: Dataset, out: torch.Tensor, y: torch.Tensor) -> None:
    """A loss of your own on one batch: it runs, and returns one finite number."""
    if ds.loss in BUILTIN:
        return
    try:
        value = loss_fn(ds)(out, y)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever it raises, it raises on every retry
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"training.loss {ds.loss!r} fails on a batch of data {ds.name} (outputs "
                          f"{list(out.shape)}, labels {list(y.shape)} {y.dtype}): {type(e).__name__}: {first}") from None  # fmt: skip
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        got = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"training.loss {ds.loss!r} returned {got} for a batch of data {ds.name}; a loss returns "
                          "one number (a scalar tensor), e.g. its mean over the batch")  # fmt: skip
    if not torch.isfinite(value.detach()).all():
        raise ConfigError(f"training.loss {ds.loss!r} returned {float(value)} for a batch of data {ds.name}")
