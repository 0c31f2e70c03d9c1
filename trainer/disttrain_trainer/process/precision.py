"""Mixed precision (Micikevicius et al. 2018) with torch.amp.

fp32 master weights always; bf16 autocast on CPU and GPU (no loss scaling
needed: bf16 has fp32's exponent range); fp16 autocast with a GradScaler,
GPU only (CPU fp16 kernels are slow and partly missing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from disttrain_api.model import Precision

from .config import ConfigError


@dataclass(frozen=True, kw_only=True)
class Amp:
    precision: Precision
    device: torch.device
    scaler: torch.amp.GradScaler | None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.precision == "fp32":
            yield
            return
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        with torch.autocast(device_type=self.device.type, dtype=dtype):
            yield


def make_amp(precision: Precision, device: torch.device) -> Amp:
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(
            "training.precision fp16 needs a GPU (GradScaler on CUDA); use bf16 or fp32 on CPU"
        )
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    return Amp(precision=precision, device=device, scaler=scaler)
