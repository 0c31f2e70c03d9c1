"""LocalSGD and DiLoCo: replicas step on their own and synchronise every `interval` steps.

localsgd (Lin et al. 2018): every H steps the replicas' parameters are averaged.
diloco (Douillard et al. 2023): every H steps each replica's change since the last sync, the
pseudo-gradient anchor - params, is averaged and applied to the anchor by an outer optimizer
(SGD with Nesterov momentum, lr 0.7 in the paper); every replica then continues from the new anchor.

Each sync all-reduces one copy of the parameters: H times fewer bytes than all-reducing the
gradients every step. With spec.every_step_first the first steps all-reduce the gradients (the
trainer wraps the model in DDP for them) and the replicas step apart from the model they reach.
The all-reduce goes through an `Averager`: the job's process group, or torchft's Manager for
fault-tolerant replicas (a sync is then one quorum + commit: when it fails, every replica goes back
to the anchor and the H steps since are discarded, as torchft does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from disttrain_api.model import SyncSpec
from torch import nn

from .ddp import CommTimes


class Averager(Protocol):
    def average(self, tensors: list[torch.Tensor]) -> bool:
        """Average `tensors` in place over the replicas; False when the sync must be discarded."""
        ...


def replicate(model: nn.Module) -> nn.Module:
    """Rank 0's parameters and buffers on every rank of the default group (what DDP's wrap does)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
    return model


class GroupAverager:
    """Over the default process group (every rank a replica). Never fails softly: a lost peer
    fails the collective, and the gang restarts as in every other collective mode."""

    def average(self, tensors: list[torch.Tensor]) -> bool:
        world = dist.get_world_size()
        works = [dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True) for t in tensors]
        for w, t in zip(works, tensors, strict=True):
            assert w is not None
            w.wait()
            t.div_(world)
        return True


class ManagerAverager:
    """Over torchft's Manager: a quorum, the all-reduce over its participants, the commit vote."""

    def __init__(self, manager: Any, on_quorum: Callable[[], None] | None = None) -> None:
        self.manager, self.on_quorum = manager, on_quorum

    def average(self, tensors: list[torch.Tensor]) -> bool:
        self.manager.start_quorum()
        if self.on_quorum is not None:
            self.on_quorum()
        works = [self.manager.allreduce(t) for t in tensors]
        for w in works:
            w.wait()
        return bool(self.manager.should_commit())


@dataclass(frozen=True, kw_only=True)
class SyncResult:
    committed: bool
    comm: CommTimes
    bytes: int


class OuterSync:
    """The sync of `model`'s parameters every `spec.interval` steps (`due`, `sync`)."""

    def __init__(self, model: nn.Module, spec: SyncSpec, averager: Averager) -> None:
        if spec.kind == "every-step":
            raise ValueError("OuterSync is for sync kinds localsgd and diloco")
        self.spec, self.averager = spec, averager
        self.params = [p for p in model.parameters() if p.requires_grad]
        # The parameters at the last sync: DiLoCo's global model, and what a discarded sync restores.
        self.anchor = [nn.Parameter(p.detach().clone()) for p in self.params]
        self.outer: torch.optim.Optimizer | None = None
        if spec.kind == "diloco":
            o = spec.outer_optimizer
            self.outer = torch.optim.SGD(self.anchor, lr=o.lr, momentum=o.momentum if o.name == "nesterov" else 0.0,
                                         nesterov=o.name == "nesterov")  # fmt: skip
        self.syncs = 0
        self.discarded = 0

    @property
    def bytes_per_sync(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)

    def every_step(self, step: int) -> bool:
        """Whether the step numbered `step` (1-based) all-reduces its gradients (spec.every_step_first)."""
        return self.spec.every_step_at(step)

    def due(self, step: int) -> bool:
        """Whether the step numbered `step` (1-based) ends with a sync."""
        return self.spec.sync_at(step)

    @torch.no_grad()
    def step_apart(self) -> None:
        """The every-step steps are over: the model they reached (the same on every replica) is the
        anchor the replicas now step apart from, with a fresh outer optimizer."""
        for a, p in zip(self.anchor, self.params, strict=True):
            a.copy_(p.detach())
        if self.outer is not None:
            self.outer.state.clear()

    @torch.no_grad()
    def sync(self) -> SyncResult:
        start = time.perf_counter()
        if self.spec.kind == "localsgd":
            sent = [p.detach().clone() for p in self.params]
        else:  # the pseudo-gradient: how far this replica moved from the anchor
            sent = [a.detach() - p.detach() for a, p in zip(self.anchor, self.params, strict=True)]
        committed = self.averager.average(sent)
        if committed:
            if self.outer is None:
                for a, avg in zip(self.anchor, sent, strict=True):
                    a.copy_(avg)
            else:
                for a, g in zip(self.anchor, sent, strict=True):
                    a.grad = g
                self.outer.step()
                self.outer.zero_grad(set_to_none=True)
            self.syncs += 1
        else:
            self.discarded += 1
        for p, a in zip(self.params, self.anchor, strict=True):
            p.copy_(a)  # committed: the new global model; discarded: back to the last one
        seconds = time.perf_counter() - start
        return SyncResult(committed=committed, comm=CommTimes(busy_s=seconds, exposed_s=seconds),
                          bytes=self.bytes_per_sync)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": [a.detach().clone() for a in self.anchor],
                "outer": self.outer.state_dict() if self.outer is not None else None,
                "syncs": self.syncs}  # fmt: skip

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        for a, saved in zip(self.anchor, state["anchor"], strict=True):
            a.copy_(saved)
        if self.outer is not None and state.get("outer") is not None:
            self.outer.load_state_dict(state["outer"])
        self.syncs = int(state.get("syncs", 0))
