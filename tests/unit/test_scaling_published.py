"""The forecast against two published scaling results, from the inputs those papers state.

Each case is written as the summary a disttrain run at the paper's base size (one 8-GPU host)
would have produced, with the paper's compute time, bytes and links; the forecast then
predicts the step at the paper's largest size, and the scaling efficiency step(8) / step(N)
(weak scaling, as both report it) must land within 10 points of the published figure.

Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour":
  from the paper: ResNet-50, ~25 M parameters = ~100 MB of fp32 gradients; backward of one
  P100 on its 32 images 120 ms; Big Basin servers of 8 P100 joined by NVLink, one 50 Gbit/s
  Ethernet card per server; gradient aggregation overlapped with backward; ~90 % scaling
  efficiency from 8 to 256 GPUs.
  assumed here (the paper does not state them): forward = half of backward (60 ms); 4
  all-reduce buckets of 25 MB (DDP's default), the first sent after a quarter of backward,
  so 90 ms of backward overlap them; NVLink ring 20 GB/s (NVIDIA's P100 figure per link and
  direction), 5 us per message; Ethernet 10 us per message.
torchtitan, docs/performance.md (Llama 3.1 8B, FSDP, Grand Teton):
  from torchtitan: 5,762 tokens/s per GPU on 8 H100 (Table 1) and 5,605 on 128 (Table 3):
  97.3 %; local batch 2 of 8192 tokens (llama3_8b.toml); hosts of 8 H100 joined by NVLink,
  400 Gb/s RDMA per GPU between hosts; FSDP all-gathers bf16 parameters and reduce-scatters
  fp32 gradients (its mixed_precision_param / mixed_precision_reduce defaults).
  assumed here: 8.03 B parameters and 32 layers (Meta's model card), one FSDP unit per layer
  plus the root; NVLink 450 GB/s per direction (NVIDIA's H100 SXM figure), 5 us per message
  on either link.
"""

from __future__ import annotations

from typing import Any

import pytest
from disttrain_api.scaling import Layout, Link, forecast, measured_from_summary
from disttrain_api.scaling import collectives as col
from disttrain_api.scaling.model import step_time

WITHIN = 0.10


def base_run(*, strategy: str, compute: float, busy: float, exposed: float, params_bytes: float, grad_bytes: float,
             blocks: int, buckets: int, intra: Link, batch: int) -> dict[str, Any]:  # fmt: skip
    """The summary of a run on one host of 8 GPUs (world 8, data parallel), as the trainer writes it."""
    return {
        "mode": "data", "worldSize": 8, "layout": "dp=8,pp=1,tp=1", "device": "cuda", "backend": "nccl",
        "dataStrategy": strategy,
        "scaling": {
            "perStep": {"stepS": compute + exposed, "dataS": 0.0, "computeS": compute, "commExposedS": exposed,
                        "commBusyS": busy, "idleS": 0.0, "steps": 100},
            "batchPerReplica": batch, "parameters": int(params_bytes // 2), "parameterBytes": int(params_bytes),
            "gradientBytes": int(grad_bytes), "blocks": blocks, "buckets": buckets, "compression": {"kind": "none"},
            "link": {"alphaS": intra.alpha_s, "betaBytesPerS": intra.beta_bytes_per_s, "worldSize": 8},
            "host": {"cores": 64, "ranksOnHost": 8, "threadsPerRank": 1},
        },
    }  # fmt: skip


def efficiency(run: dict[str, Any], layout_n: Layout, *, inter: Link) -> float:
    fc = forecast(measured_from_summary(run, source="paper"), link=inter, ranks_per_host=8, sizes=(8, layout_n.n))
    base = step_time(fc.calibrated, Layout(dp=8, strategy=layout_n.strategy), fc.topology, fc.placement).step_s
    return base / step_time(fc.calibrated, layout_n, fc.topology, fc.placement).step_s


def test_goyal_resnet50_8_to_256_gpus() -> None:
    grads, buckets = 100e6, 4
    nvlink = Link(alpha_s=5e-6, beta_bytes_per_s=20e9)
    ethernet = Link(alpha_s=10e-6, beta_bytes_per_s=50e9 / 8)
    forward, backward, window = 0.060, 0.120, 0.090
    # what DDP's timer reports on one server: the last bucket's all-reduce is exposed,
    # busy spans from the first bucket's launch to the end
    tail = col.all_reduce_s(8, grads, nvlink, calls=buckets) / buckets
    run = base_run(strategy="ddp", compute=forward + backward, busy=window + tail, exposed=tail,
                   params_bytes=grads, grad_bytes=grads, blocks=18, buckets=buckets, intra=nvlink, batch=32)  # fmt: skip
    eff = efficiency(run, Layout(dp=256), inter=ethernet)
    assert eff == pytest.approx(0.90, abs=WITHIN), eff


def test_torchtitan_llama3_8b_fsdp_8_to_128_h100() -> None:
    params = 8.03e9
    nvlink = Link(alpha_s=5e-6, beta_bytes_per_s=450e9)
    rdma = Link(alpha_s=5e-6, beta_bytes_per_s=400e9 / 8)
    step8 = 2 * 8192 / 5762  # seconds: local batch 2 x 8192 tokens at 5,762 tokens/s per GPU
    units = 32 + 1
    comm = 2 * col.all_gather_s(8, 2 * params, nvlink, calls=units) + col.reduce_scatter_s(8, 4 * params, nvlink, calls=units)
    tail = comm / units  # the first unit's all-gather: nothing to hide it under
    run = base_run(strategy="fsdp", compute=step8 - tail, busy=comm, exposed=tail, params_bytes=2 * params,
                   grad_bytes=4 * params, blocks=units + 1, buckets=1, intra=nvlink, batch=2)  # fmt: skip
    published = 5605 / 5762
    eff = efficiency(run, Layout(dp=128, strategy="fsdp"), inter=rdma)
    assert eff == pytest.approx(published, abs=WITHIN), eff
