"""Update compression: int8 with one scale per tensor, or top-k with client-side error feedback.

Applied to the update (local model - global model), never to the model. The
wire tensors of one parameter `p` are:
  none: p (float32);
  int8: p.q (int8) and scalar "p.scale" (x = q * scale, scale = max|x| / 127);
  topk: p.idx (int64 flat indices) and p.val (float32): the k largest |x + residual|;
        what was not sent stays in the client's residual and goes out later
        (error feedback, Lin et al. 2018 / Stich et al. 2018), so nothing is lost for good.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

Named = list[tuple[str, torch.Tensor]]


class DecodeError(ValueError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def encode(
    kind: str,
    update: Named,
    *,
    topk_ratio: float = 0.01,
    residual: dict[str, torch.Tensor] | None = None,
) -> tuple[Named, dict[str, float]]:
    """(wire tensors, scalars). `residual` (topk only) is read and updated in place."""
    if kind == "none":
        return [(n, t.float()) for n, t in update], {}
    if kind == "int8":
        out: Named = []
        scalars: dict[str, float] = {}
        for n, t in update:
            amax = float(t.abs().max()) if t.numel() else 0.0
            scale = amax / 127.0 if amax > 0 else 1.0
            out.append((n + ".q", torch.round(t / scale).clamp(-127, 127).to(torch.int8)))
            scalars[n + ".scale"] = scale
        return out, scalars
    if kind == "topk":
        if residual is None:
            raise ValueError("topk needs the client's residual dict (error feedback)")
        out = []
        for n, t in update:
            acc = t.float() + residual.get(n, torch.zeros_like(t, dtype=torch.float32))
            flat = acc.reshape(-1)
            k = max(1, math.ceil(topk_ratio * flat.numel())) if flat.numel() else 0
            idx = torch.topk(flat.abs(), k, sorted=False).indices if k else torch.empty(0, dtype=torch.int64)
            val = flat[idx]
            rest = flat.clone()
            rest[idx] = 0.0
            residual[n] = rest.reshape(t.shape)
            out.append((n + ".idx", idx.to(torch.int64)))
            out.append((n + ".val", val.contiguous()))
        return out, {}
    raise ValueError(f"unknown compression {kind!r}")


def expected_wire(kind: str, shapes: Sequence[tuple[str, torch.Size]]) -> dict[str, tuple[torch.dtype, tuple[int, ...] | None]]:
    """Name -> (dtype, shape or None when the length is the sender's choice up to the tensor size)."""
    out: dict[str, tuple[torch.dtype, tuple[int, ...] | None]] = {}
    for n, s in shapes:
        if kind == "none":
            out[n] = (torch.float32, tuple(s))
        elif kind == "int8":
            out[n + ".q"] = (torch.int8, tuple(s))
        elif kind == "topk":
            out[n + ".idx"] = (torch.int64, None)
            out[n + ".val"] = (torch.float32, None)
    return out


def wire_limit(kind: str, shapes: Sequence[tuple[str, torch.Size]]) -> int:
    """The most payload bytes a well-formed update may have: a longer stream is refused."""
    numel = sum(math.prod(s) for _, s in shapes)
    per = {"none": 4, "int8": 1, "topk": 12}[kind]
    return numel * per


def decode(
    kind: str,
    wire: Named,
    scalars: Mapping[str, float],
    shapes: Sequence[tuple[str, torch.Size]],
) -> Named:
    """Dense float32 update from wire tensors; DecodeError on any mismatch (shape, dtype, index)."""
    got = dict(wire)
    expect = expected_wire(kind, shapes)
    if set(got) != set(expect):
        missing = sorted(set(expect) - set(got))[:3]
        extra = sorted(set(got) - set(expect))[:3]
        raise DecodeError("bad_shape", f"tensor names do not match the model: missing {missing}, unexpected {extra}")
    for n, (dtype, shape) in expect.items():
        t = got[n]
        if t.dtype != dtype:
            raise DecodeError("bad_dtype", f"{n}: dtype {t.dtype}, expected {dtype}")
        if shape is not None and tuple(t.shape) != shape:
            raise DecodeError("bad_shape", f"{n}: shape {tuple(t.shape)}, expected {shape}")
    out: Named = []
    for n, s in shapes:
        if kind == "none":
            out.append((n, got[n]))
        elif kind == "int8":
            scale = scalars.get(n + ".scale")
            if scale is None or not math.isfinite(scale) or scale < 0:
                raise DecodeError("bad_scale", f"{n}: missing or non-finite int8 scale")
            out.append((n, got[n + ".q"].float() * scale))
        else:
            idx, val = got[n + ".idx"], got[n + ".val"]
            numel = math.prod(s)
            if idx.dim() != 1 or val.shape != idx.shape or idx.numel() > numel:
                raise DecodeError("bad_shape", f"{n}: topk idx/val must be equal-length vectors of at most {numel}")
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= numel):
                raise DecodeError("bad_index", f"{n}: topk index outside [0, {numel})")
            dense = torch.zeros(numel, dtype=torch.float32)
            dense.index_put_((idx,), val, accumulate=False)
            out.append((n, dense.reshape(s)))
    return out
