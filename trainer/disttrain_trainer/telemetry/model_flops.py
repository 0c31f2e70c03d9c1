"""Tokens per second and model FLOPs utilisation (MFU) of the GPT model.

MFU = achieved model FLOP/s / the accelerators' peak FLOP/s, with the model's
FLOPs counted analytically as in the PaLM paper (Chowdhery et al. 2022, app. B):
6 FLOPs per token per matmul parameter (forward 2, backward 4) plus the
attention scores, 12 * layers * dim * sequence. Recomputation (activation
checkpointing) is not counted: MFU measures useful work, the same figure
whatever the memory trade-off. Embedding lookups are not matmuls; the output
head is.

The peak is the datasheet's dense figure for the precision the matmuls run in;
for a GPU not in the table MFU is left out rather than guessed.
"""

from __future__ import annotations

from typing import Any

import torch
from disttrain_api.model import JobSpec, Precision

# Dense (no sparsity) peak FLOP/s by device-name fragment, most specific first.
# Keys of each row: the precision the matmuls run in.
_PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("H100 PCIe", {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378.0e12, "fp32": 51.2e12}),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("A100", {"bf16": 312.0e12, "fp16": 312.0e12, "tf32": 156.0e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362.1e12, "fp16": 362.1e12, "tf32": 183.0e12, "fp32": 91.6e12}),
)


def gpt_flops_per_token(*, dim: int, layers: int, vocab: int, seq: int) -> float:
    """Training FLOPs per token: 6 x matmul parameters + 12 x layers x dim x seq (attention)."""
    matmul_params = layers * 12 * dim * dim + dim * vocab  # qkv 3d², proj d², MLP 8d²; the head
    return 6.0 * matmul_params + 12.0 * layers * dim * seq


def peak_flops(device: torch.device, precision: Precision) -> float | None:
    """The device's dense peak for the precision its matmuls run in, or None if unknown."""
    if device.type != "cuda":
        return None  # a CPU's peak depends on its cores, clocks and vector units: not guessed
    name = torch.cuda.get_device_name(device)
    kind = precision
    if precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
        kind = "tf32"
    for fragment, peaks in _PEAK_FLOPS:
        if fragment in name:
            return peaks[kind]
    return None


def throughput_fields(
    spec: JobSpec, *, vocab: int, samples_per_s: float, device: torch.device, accelerators: int
) -> dict[str, Any]:
    """Summary fields for a GPT job: tokensPerS, modelFlopsPerToken, and mfu where the peak is known.

    `samples_per_s` is the whole job's (one sample = one window of blockSize tokens);
    `accelerators` is how many devices share the work (the world size)."""
    if spec.model.name != "gpt":
        return {}
    m = spec.model
    per_token = gpt_flops_per_token(dim=m.hidden, layers=m.layers, vocab=vocab, seq=m.block_size)
    tokens_per_s = samples_per_s * m.block_size
    fields: dict[str, Any] = {"tokensPerS": tokens_per_s, "modelFlopsPerToken": per_token}
    peak = peak_flops(device, spec.training.precision)
    if peak is not None:
        fields["mfu"] = tokens_per_s * per_token / (peak * accelerators)
    return fields
