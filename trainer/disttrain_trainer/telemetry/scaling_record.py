"""What a scaling forecast (disttrain_api.scaling, `disttrain explain`) needs beyond the step metrics.

Measured once per run, written into the summary's `scaling` block by rank 0:
  - the link between the job's ranks: timed all-reduces of a few sizes at start, fitted to
    the alpha-beta model (`probe_link`; nothing to measure at world size 1);
  - per step, the steady state: the step categories with the process's first log interval
    (warm-up: allocation, DDP's bucket rebuild, the census step) left out (`ScalingRecorder`);
  - the bytes each collective moves: one step profiled for its collectives (DDP: step
    CENSUS_STEP; mesh modes: the profiler already samples every tenth step): count and
    payload per kind, hence DDP's buckets and the compression hooks' real wire bytes;
  - the model: parameters and their bytes, blocks, PowerSGD's payload for any rank (from the
    parameter shapes), and for the built-in GPT and MLP the activation one layer passes on
    and Megatron's tensor-parallel collectives (what a run without tensor parallelism cannot
    measure);
  - the host: cores (affinity and cgroup quota), ranks on it, threads per rank;
  - pipelines: every block's profiled time and output bytes (the partitioner's profile),
    each stage's measured compute per step, the bytes crossing each stage boundary.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from disttrain_api.scaling import fit_link
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

from ..parallel.comm_profile import census
from ..process.threads import usable_cores
from .step_metrics import Tally

# The kubelet keeps this many bytes of a container's termination message (the job's status.result).
TERMINATION_MESSAGE_LIMIT = 4096
# Dropped in this order while rank 0's summary does not fit the termination message (summary.json keeps them).
DROP_FOR_MESSAGE = (("link", "bytes"), ("link", "seconds"), ("collectives",), ("pipeline", "blockOutBytes"),
                    ("pipeline", "blockSeconds"), ())  # fmt: skip
# The DDP step profiled for its collectives, counted from the process's first: DDP rebuilds its
# buckets after the first, PowerSGD compresses from the second on (parallel/ddp.py), so the
# third sends what every later step sends.
CENSUS_STEP = 3
PROBE_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
# Per size: the median of these (the typical all-reduce, which a step's mean sees) and the
# quartiles around it. 5 repetitions let one slow moment of a busy host move the fitted link by
# tens of percent between two runs of the same job; 15 hold the median steady, and the quartiles
# say how far it may still be off (the forecast's uncertainty, `disttrain explain`).
PROBE_REPS = 15


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def probe_link(device: torch.device, world_size: int) -> dict[str, Any] | None:
    """All-reduce PROBE_BYTES over every rank (collective: all ranks call it), fit alpha and beta.

    Each rank keeps its median of PROBE_REPS per size (not the fastest: a step's mean time sees
    the typical all-reduce, scheduling delays included) and its quartiles; the slowest rank's
    figures are taken (an all-reduce of the times), so every rank fits the same link. `fast` and
    `slow` are the links fitted to the first and third quartiles: the range the typical link lies
    in. About 70 all-reduces of at most 4 MiB: a fraction of a second on a CPU host."""
    if world_size < 2:
        return None
    cuda = device.type == "cuda"
    typical: list[tuple[float, float, float]] = []
    for nbytes in PROBE_BYTES:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # connections and buffers set up outside the timing
        reps = []
        for _ in range(PROBE_REPS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if cuda:
                torch.cuda.synchronize(device)
            reps.append(time.perf_counter() - t0)
        typical.append(_quartiles(reps))
    times = torch.tensor([t for q in typical for t in q], dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    low, mid, high = ([float(times[3 * i + k]) for i in range(len(PROBE_BYTES))] for k in range(3))

    def fit(seconds: list[float]) -> Any:
        return fit_link(world_size, list(zip(PROBE_BYTES, seconds, strict=True)))

    link, fast, slow = fit(mid), fit(low), fit(high)
    return {"alphaS": link.alpha_s, "betaBytesPerS": link.beta_bytes_per_s, "worldSize": world_size,
            "fast": {"alphaS": fast.alpha_s, "betaBytesPerS": fast.beta_bytes_per_s},
            "slow": {"alphaS": slow.alpha_s, "betaBytesPerS": slow.beta_bytes_per_s},
            "bytes": list(PROBE_BYTES), "seconds": mid}  # fmt: skip


@dataclass(kw_only=True)
class ScalingRecorder:
    """Per process: the probe's link, the steady-state tally, the census and the pipeline profile."""

    link: dict[str, Any] | None = None
    steady: Tally = field(default_factory=Tally)
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)  # collective census of one step
    profiles: list[Any] | None = None  # the partitioner's BlockProfiles (pipeline, rank 0)
    hook_wire_elements: int | None = None  # PowerSGD: elements its all-reduces carried in the census step
    _intervals: int = 0

    def interval(self, tally: Tally) -> None:
        """A finished log interval; the process's first one (its warm-up) stays out."""
        self._intervals += 1
        if self._intervals > 1:
            self.steady.merge(tally)

    def with_census(self, step_fn: Callable[..., Any], model: nn.Module) -> Callable[..., Any]:
        """`step_fn` that profiles the CENSUS_STEP-th step this process runs for its collectives
        (DDP; mesh modes have ProfiledComm.kinds). The other steps pay one extra call."""
        if not isinstance(model, DDP):
            return step_fn
        calls = 0

        def step(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls != CENSUS_STEP:
                return step_fn(*args, **kwargs)
            with self._census(getattr(model, "comm_hook_state", None)):
                return step_fn(*args, **kwargs)

        return step

    @contextlib.contextmanager
    def _census(self, hook_state: Any) -> Iterator[None]:
        """The profiler's census of the step's collectives; PowerSGD's own count of what it sent.

        PowerSGD issues its second and third all-reduce (P, Q) from callbacks on the backend's
        threads, which the profiler does not see; the hook counts the elements it all-reduces
        (`total_numel_after_compression`, every bucket, compressed or not), so the step's
        difference of that counter is its wire payload."""
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # as comm_profile: no per-step log lines
        before = getattr(hook_state, "total_numel_after_compression", None)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            yield
        self.kinds = census(prof.profiler.kineto_results.events())
        prof.profiler = None  # frees the events at once (see comm_profile.ProfiledComm.step)
        if before is not None:
            self.hook_wire_elements = int(hook_state.total_numel_after_compression - before)

    def per_step(self, totals: Tally) -> dict[str, float]:
        """Per-step means of the steady state (the whole run when it had a single interval)."""
        src = self.steady if self.steady.steps else totals
        rec = src.record()
        return {"stepS": rec["step_s"], "dataS": rec["data_s"], "computeS": rec["compute_s"],
                "commExposedS": rec["comm_exposed_s"], "commBusyS": rec["comm_busy_s"], "idleS": rec["idle_s"],
                "steps": src.steps}  # fmt: skip


def _elem(precision: str) -> int:
    return 2 if precision in ("bf16", "fp16") else 4


def model_facts(model: nn.Module, *, batch: int, precision: str) -> dict[str, Any]:
    """Parameters, blocks, PowerSGD's payload and, for the built-in models, the activations and
    Megatron's tensor-parallel collectives at this replica batch."""
    from ..models import GPT, MLP  # noqa: PLC0415 - models imports torch modules only needed here

    params = list(model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params)
    low = unc = 0
    for p in params:  # PowerSGD views each gradient as shape[0] x rest; vectors go uncompressed
        if p.dim() >= 2:
            low += (p.shape[0] + p.numel() // p.shape[0]) * p.element_size()
        else:
            unc += p.numel() * p.element_size()
    pipe = getattr(model, "pipeline_blocks", None)
    blocks = len(list(model)) if isinstance(model, nn.Sequential) else len(pipe()) if callable(pipe) else 1
    out: dict[str, Any] = {"parameters": sum(p.numel() for p in params), "parameterBytes": nbytes,
                           "gradientBytes": nbytes, "blocks": blocks,
                           "lowRank": {"bytesPerRank": low, "uncompressedBytes": unc}}  # fmt: skip
    e = _elem(precision)
    if isinstance(model, GPT):
        layers, hidden = len(model.blocks), model.tok.embedding_dim
        act = batch * model.block_size * hidden * e
        heads = model.blocks[0].attn.qkv.out_features // (3 * model.blocks[0].attn.head_dim)
        # Megatron: 2 all-reduces per block forward, 2 backward, the embedding's and the head's
        out |= {"activationBytes": act, "tensorLimit": heads,
                "tensorComm": {"count": 4 * layers + 2, "bytes": (4 * layers + 2) * act, "source": "megatron"}}  # fmt: skip
    elif isinstance(model, MLP):
        hidden = model.stem[0].out_features
        act = batch * hidden * e
        pairs = (len(model.blocks) + 2) // 2  # column/row pairs along stem -> blocks -> head
        count = max(0, 2 * pairs - 1)  # each pair: forward all-reduce; backward one but for the stem's input
        out |= {"activationBytes": act, "tensorLimit": hidden,
                "tensorComm": {"count": count, "bytes": count * act, "source": "megatron"}}  # fmt: skip
    return out


def ddp_facts(model: nn.Module, rec: ScalingRecorder, *, compression: str, rank: int) -> dict[str, Any]:
    """DDP's buckets, its all-reduce calls per step and the payload they really carried (after the
    comm hook's compression), and whether the hook holds up backward (see below)."""
    comp: dict[str, Any] = {"kind": compression, "rank": rank if compression == "powersgd" else 0}
    out: dict[str, Any] = {"compression": comp}
    if not isinstance(model, DDP):
        return out
    sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))  # noqa: SLF001 - DDP's own record
    buckets = max(1, len([s for s in sizes.split(",") if s.strip()]))
    out["buckets"] = buckets
    if compression == "powersgd":
        # Per bucket: the uncompressed vectors, then P, then Q (torch's powerSGD_hook).
        comp["calls"] = 3 * buckets
        if rec.hook_wire_elements is not None:
            comp["wireBytes"] = rec.hook_wire_elements * 4  # the hook's factors and vectors: fp32 gradients
        # On a CPU each bucket is finished inside its hook (parallel/ddp.py, _in_issue_order):
        # backward waits for it, so none of its time overlaps compute.
        comp["blocksBackward"] = not model.device_ids
    elif "all_reduce" in rec.kinds:
        comp["calls"], comp["wireBytes"] = rec.kinds["all_reduce"]
    return out


def measured_tensor_comm(kinds: dict[str, tuple[int, int]]) -> dict[str, Any] | None:
    """A pure tensor-parallel step's collectives, all of them the tensor group's."""
    count = sum(c for c, _ in kinds.values())
    return {"count": count, "bytes": sum(b for _, b in kinds.values()), "source": "measured"} if count else None


def host_facts(*, world_size: int, nproc_per_node: int, master_addr: str) -> dict[str, Any]:
    local = master_addr in ("127.0.0.1", "localhost", "::1")  # `disttrain local`: every rank here
    return {"cores": usable_cores(), "ranksOnHost": world_size if local else nproc_per_node,
            "threadsPerRank": torch.get_num_threads()}  # fmt: skip


def pipeline_facts(profiles: Sequence[Any] | None, bounds: Sequence[tuple[int, int]],
                   stage_compute: Sequence[float]) -> dict[str, Any]:  # fmt: skip
    """Block profile (rank 0's, None for a plan taken from a checkpoint), measured stage compute
    per step, and the activation bytes per micro-batch at each stage boundary."""
    out: dict[str, Any] = {"stageComputeS": list(stage_compute)}
    if profiles:
        out |= {"blockSeconds": [p.seconds for p in profiles], "blockOutBytes": [p.out_bytes for p in profiles],
                "boundaryBytes": [profiles[b - 1].out_bytes for _, b in bounds[:-1]]}  # fmt: skip
    return out


def gather_stage_compute(rec: ScalingRecorder, totals: Tally, *, replica: int, stage: int, world_size: int,
                         stages: int) -> list[float]:  # fmt: skip
    """Each stage's compute per step (replica 0, tensor index 0; collective: all ranks call it)."""
    mine = rec.per_step(totals)["computeS"]
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, (replica, stage, mine))
    per_stage = [0.0] * stages
    for r, s, c in everyone:
        if r == 0:
            per_stage[s] = c
    return per_stage


def summary_block(rec: ScalingRecorder, *, totals: Tally, model: nn.Module, batch: int, precision: str,
                  host: dict[str, Any], ddp: dict[str, Any] | None = None,
                  kinds: dict[str, tuple[int, int]] | None = None, pure_tensor: bool = False,
                  pipeline: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The summary's `scaling` block (disttrain_api.scaling.inputs documents every field).

    `kinds`: the census of a mesh mode's profiled step (else DDP's census step); `pure_tensor`:
    every collective in it belongs to the tensor-parallel group (data degree 1)."""
    kinds = kinds if kinds is not None else rec.kinds
    block: dict[str, Any] = {"perStep": rec.per_step(totals), "batchPerReplica": batch,
                             **model_facts(model, batch=batch, precision=precision),
                             "collectives": {k: list(v) for k, v in kinds.items()},
                             "link": rec.link, "host": host}  # fmt: skip
    if ddp:
        block |= ddp
    measured = measured_tensor_comm(kinds) if pure_tensor else None
    if measured is not None:
        block["tensorComm"] = measured
    if pipeline is not None:
        block["pipeline"] = pipeline
    return _rounded(block)


def _rounded(value: Any) -> Any:
    """Floats to 4 significant digits (plenty for a forecast; keeps the termination message short)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def termination_message(summary: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """The summary as JSON within `limit` bytes: the kubelet cuts a longer message, and a cut JSON
    is no result at all. The scaling block's bulkiest parts go first, then the whole block."""
    text = json.dumps(summary, sort_keys=True)
    if len(text.encode()) <= limit or not isinstance(summary.get("scaling"), dict):
        return text
    trimmed = copy.deepcopy(summary)
    for path in DROP_FOR_MESSAGE:
        full = ("scaling", *path)
        parent: Any = trimmed
        for key in full[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(full[-1], None)
        text = json.dumps(trimmed, sort_keys=True)
        if len(text.encode()) <= limit:
            break
    return text
