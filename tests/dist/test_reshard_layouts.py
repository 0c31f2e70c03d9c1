"""A DCP checkpoint saved in one layout loads in another with equal parameters and optimizer state.

TP 2 -> data 2, data 2 -> TP 2 (each rank holds a plain model in "data"), and
DP 2 x TP 2 with FSDP (4 processes) -> one process without a process group.
The saving ranks also write the full tensors (gathered with full_tensor) as the
reference the loaded model must equal.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from disttrain_trainer.checkpoints import sharded as sc
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel.hybrid import apply_layout
from disttrain_trainer.parallel.mesh import Layout, build_mesh
from torch.distributed.tensor import DTensor

TOL = 1e-6


def _layout(dp: int, tp: int, strategy: str = "ddp") -> Layout:
    return Layout(dp=dp, pp=1, tp=tp, data_strategy=strategy, sequence_parallel=False)


def _model(seed: int, layout: Layout) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(vocab=29, block_size=8, dim=16, layers=2, heads=4, dropout=0.0, act_ckpt="none")
    if layout.world_size > 1:
        model = apply_layout(model, mesh=build_mesh(layout, "cpu"), layout=layout, device=torch.device("cpu"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"p/{n}": _full(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        out[f"exp_avg/{n}"] = _full(opt.state[p]["exp_avg"])
    return out


def _train_and_save(root: str, layout: Layout) -> None:
    from torch.distributed.tensor.parallel import loss_parallel

    model, opt = _model(0, layout)
    torch.manual_seed(1)  # same batch on every rank: the data dimension sees replicas of it
    x, y = torch.randint(0, 29, (4, 8)), torch.randint(0, 29, (4, 8))
    with loss_parallel():
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.view(-1, 29), y.reshape(-1)).backward()
    opt.step()
    sc.save(Path(root), 3, model=model, optimizer=opt, extra={"step": 3}, keep=2, layout=str(layout))
    snap = _snapshot(model, opt)
    if dist.get_rank() == 0:
        torch.save(snap, Path(root) / "reference.pt")


def _load_and_check(root: str, layout: Layout) -> None:
    model, opt = _model(7, layout)  # other initial values: the load must overwrite all of them
    (step, path), = sc.list_checkpoints(Path(root))
    extra = sc.load(path, model=model, optimizer=opt)
    assert step == 3 and extra["step"] == 3
    ref = torch.load(Path(root) / "reference.pt")
    got = _snapshot(model, opt)
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=TOL, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_tensor_2_to_data_2_and_back(gloo, tmp_path: Path) -> None:  # noqa: ANN001
    gloo(_train_and_save, 2, str(tmp_path / "tp"), _layout(1, 2))
    gloo(_load_and_check, 2, str(tmp_path / "tp"), _layout(2, 1))
    gloo(_train_and_save, 2, str(tmp_path / "dp"), _layout(2, 1))
    gloo(_load_and_check, 2, str(tmp_path / "dp"), _layout(1, 2))


def test_hybrid_2x2_fsdp_to_one_process(gloo, tmp_path: Path) -> None:  # noqa: ANN001
    gloo(_train_and_save, 4, str(tmp_path), _layout(2, 2, "fsdp"))
    assert not dist.is_initialized()
    _load_and_check(str(tmp_path), _layout(1, 1))
