"""A federated client's local training: `localEpochs` of SGD on its own rows from the global
model (FedProx adds the proximal term mu/2 ||w - w_global||^2), and the update it sends
(local - global). The client runner (client.py) calls it off the event loop.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from disttrain_api.model import JobSpec
from torch import nn

from . import faults as hooks


@dataclass
class ClientState:
    cid: str
    x: torch.Tensor  # this client's training rows, loaded once
    y: torch.Tensor
    residual: dict[str, torch.Tensor] = field(default_factory=dict)  # topk error feedback
    rounds: int = 0


@dataclass(frozen=True, kw_only=True)
class LocalResult:
    update: list[tuple[str, torch.Tensor]]
    num_samples: int
    loss: float
    compute_s: float
    data_s: float


def train_local(
    model: nn.Module,
    global_state: dict[str, torch.Tensor],
    state: ClientState,
    spec: JobSpec,
    *,
    round_no: int,
    fault: str | None = None,
) -> LocalResult:
    fed = spec.federated
    assert fed is not None
    model.load_state_dict(global_state, strict=True)
    model.train()
    o = spec.optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    if o.name == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    elif o.name == "adam":
        opt = torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
    anchor = [p.detach().clone() for p in params] if fed.strategy == "fedprox" else None
    # A fresh, reproducible order per (client, round): reruns of a round see the same batches.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{spec.data.seed}:{state.cid}:{round_no}".encode()))
    n = len(state.y)
    bs = spec.data.batch_size
    compute_s = data_s = 0.0
    losses: list[float] = []
    seen = 0
    for _ in range(fed.local_epochs):
        t = time.perf_counter()
        perm = torch.randperm(n, generator=gen)
        batches = [perm[i : i + bs] for i in range(0, n, bs)]
        data_s += time.perf_counter() - t
        for idx in batches:
            t0 = time.perf_counter()
            xb, yb = state.x[idx], state.y[idx]
            t1 = time.perf_counter()
            loss = F.cross_entropy(model(xb).float(), yb)
            if anchor is not None:
                prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))
                loss = loss + fed.proximal_mu / 2 * prox
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            seen += len(idx)
            data_s += t1 - t0
            compute_s += time.perf_counter() - t1
    t = time.perf_counter()
    local = model.state_dict()
    update = [(k, (local[k] - g).float()) for k, g in global_state.items() if g.is_floating_point()]
    if fault == hooks.NAN:
        update[0][1].view(-1)[0] = float("nan")
    elif fault == hooks.SIGN_FLIP:
        norm = math.sqrt(sum(float(t.square().sum()) for _, t in update))
        scale = -hooks.SIGN_FLIP_NORM_FRACTION * fed.max_update_norm / max(norm, 1e-12)
        update = [(k, t * scale) for k, t in update]
    elif fault == hooks.OVERSIZED:
        norm = math.sqrt(sum(float(t.square().sum()) for _, t in update))
        scale = hooks.OVERSIZED_NORM_FACTOR * fed.max_update_norm / max(norm, 1e-12)
        update = [(k, t * scale) for k, t in update]
    compute_s += time.perf_counter() - t
    return LocalResult(update=update, num_samples=n, loss=float(np.mean(losses)) if losses else math.nan,
                       compute_s=compute_s, data_s=data_s)  # fmt: skip
