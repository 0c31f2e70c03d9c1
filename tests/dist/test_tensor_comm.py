"""Tensor-parallel communication is measured (profiler events), and its bytes match Megatron's formula."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from disttrain_trainer.models import GPT
from disttrain_trainer.parallel.comm_profile import ProfiledComm
from disttrain_trainer.parallel.hybrid import apply_layout
from disttrain_trainer.parallel.mesh import Layout, build_mesh
from disttrain_trainer.parallel.tensor import megatron_bytes_per_step
from torch.distributed.tensor.parallel import loss_parallel

B, T, H, L, V = 4, 16, 32, 3, 40


def _measure() -> None:
    layout = Layout(dp=1, pp=1, tp=2, data_strategy="ddp", sequence_parallel=False)
    torch.manual_seed(0)
    model = GPT(vocab=V, block_size=T, dim=H, layers=L, heads=4, dropout=0.0, act_ckpt="none")
    model = apply_layout(model, mesh=build_mesh(layout, "cpu"), layout=layout, device=torch.device("cpu"))
    x = torch.randint(0, V, (B, T))
    comm = ProfiledComm(every=1)
    for _ in range(2):
        with comm.step(), loss_parallel():
            F.cross_entropy(model(x).view(-1, V), x.reshape(-1)).backward()
        times = comm.take()
        sample = comm.taken
        busy, nbytes = times.busy_s, sample.bytes
        count, ar_bytes = sample.by_kind["all_reduce"]
        activation = B * T * H * 4
        # loss_parallel: three all-reduces of one value per token (max, sum of exps, target logit).
        loss_bytes = 3 * B * T * 4
        assert ar_bytes - loss_bytes == megatron_bytes_per_step(batch=B, seq=T, hidden=H, layers=L, elem=4)
        assert count == 4 * L + 2 + 3
        assert nbytes == ar_bytes and ar_bytes - loss_bytes == (4 * L + 2) * activation
        assert busy > 0 and 0 < times.exposed_s <= busy + 1e-9


def test_tensor_parallel_bytes_match_megatron_formula(gloo) -> None:  # noqa: ANN001
    gloo(_measure, 2)
