"""What a forecast starts from: one finished run's measurements, parsed once from its summary.

The trainer's rank 0 writes them into its summary (summary.json in the run dir, the pod's
termination message, hence the job's status.result): the usual top-level figures plus a
`scaling` block (trainer `telemetry/scaling_record.py`). Everything is per step and per rank, in
seconds and bytes, in the steady state (the first log interval of the process, with its
warm-up, left out):

  scaling.perStep        stepS, dataS, computeS, commExposedS, commBusyS, idleS
  scaling.batchPerReplica   samples one data-parallel replica takes per step
  scaling.parameters / parameterBytes / gradientBytes / blocks
  scaling.buckets        DDP's gradient buckets (all-reduce calls per step)
  scaling.collectives    {kind: [count, bytes]} of one profiled step, as the backend ran them
  scaling.compression    {kind, rank, wireBytes, calls, blocksBackward}: wireBytes = the
                         all-reduce payload DDP (its comm hook) really sent per step, in `calls`
                         collectives; blocksBackward: the hook finishes each bucket before
                         backward goes on (PowerSGD on gloo), so nothing overlaps it
  scaling.lowRank        {bytesPerRank, uncompressedBytes}: PowerSGD's payload for any rank r
                         from the parameter shapes (r x bytesPerRank + uncompressedBytes)
  scaling.tensorComm     {count, bytes, source}: tensor-parallel collectives per step
  scaling.tensorLimit    tensor degrees must divide it; scaling.activationBytes: one layer's output
  scaling.link           {alphaS, betaBytesPerS, worldSize, fast, slow}: the all-reduce probe (the
                         median of each size's repetitions), or null; fast and slow {alphaS,
                         betaBytesPerS}: the links fitted to the quartiles, the range of the probe
  scaling.host           {cores, ranksOnHost, threadsPerRank}
  scaling.pipeline       {blockSeconds, blockOutBytes, stageComputeS, boundaryBytes}

Bad or missing inputs raise `InputError` naming what is missing and how to get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .collectives import Link

SYNCHRONOUS_MODES = ("data", "tensor", "pipeline", "hybrid")
COMPRESSIONS = ("none", "fp16", "powersgd")


class InputError(ValueError):
    """A run's summary lacks what a forecast needs; the message says what and how to get it."""


@dataclass(frozen=True, kw_only=True)
class StepFigures:
    """Per-step means of rank 0 (seconds): data + compute + exposed + idle = step; busy overlaps compute."""

    step_s: float
    data_s: float
    compute_s: float
    exposed_s: float
    busy_s: float
    idle_s: float


@dataclass(frozen=True, kw_only=True)
class Host:
    cores: float
    ranks_on_host: int
    threads_per_rank: int
    device: str  # "cpu" or "cuda": only CPU ranks share cores


@dataclass(frozen=True, kw_only=True)
class PipelineFacts:
    schedule: str
    stages: int
    microbatches: int
    # per model block, one micro-batch, forward + backward, profiled alone (None: not profiled,
    # e.g. a resumed run that took its plan from the checkpoint)
    block_seconds: tuple[float, ...] | None
    block_out_bytes: tuple[int, ...] | None
    stage_compute_s: tuple[float, ...]  # measured per stage and step (replica 0, tensor index 0)
    boundary_bytes: tuple[int, ...]  # activation bytes per micro-batch crossing each stage boundary


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One run's forecast inputs (see the module docstring for the fields' meaning)."""

    source: str
    mode: str
    world_size: int
    dp: int
    pp: int
    tp: int
    data_strategy: str  # "ddp" | "fsdp"
    compression: str  # "none" | "fp16" | "powersgd"
    powersgd_rank: int
    batch_per_replica: int
    steps: StepFigures
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    blocks: int
    buckets: int
    collectives: dict[str, tuple[int, int]]
    wire_bytes: int | None  # DDP's measured all-reduce payload per step (after compression)
    ddp_calls: int | None  # DDP's all-reduce calls per step (PowerSGD: three per bucket)
    hook_blocks_backward: bool  # the comm hook finishes each bucket before backward goes on
    low_rank_bytes_per_rank: int
    uncompressed_bytes: int
    tensor_comm: tuple[int, int, str] | None  # (count, bytes, "measured" | "derived")
    tensor_limit: int  # tensor degrees must divide it (GPT heads, MLP width); 0: unknown
    activation_bytes: int  # one layer's activation for the replica's batch (0: unknown)
    link: Link | None
    link_world: int
    host: Host
    link_range: tuple[Link, Link] | None = None  # (fast, slow): the probe's quartiles' links
    backend: str
    pipeline: PipelineFacts | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # training.sync: steps between two synchronisations of the data dimension (1: every step;
    # localsgd / diloco: their interval, each sync one all-reduce of the parameters).
    sync_every: int = 1

    @property
    def label(self) -> str:
        return f"{self.source} (world {self.world_size}, dp={self.dp},pp={self.pp},tp={self.tp})"


def _get(d: dict[str, Any], path: str, kind: type | tuple[type, ...], where: str) -> Any:
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise InputError(f"{where}: {path} is missing")
        cur = cur[part]
    ok = isinstance(cur, kind) and not (isinstance(cur, bool) and kind in (int, float, (int, float)))
    if not ok:
        raise InputError(f"{where}: {path} is {cur!r}, expected {getattr(kind, '__name__', kind)}")
    return cur


def _num(d: dict[str, Any], path: str, where: str) -> float:
    return float(_get(d, path, (int, float), where))


def _layout(text: str, where: str) -> tuple[int, int, int]:
    try:
        parts = dict(p.split("=") for p in text.split(","))
        return int(parts["dp"]), int(parts["pp"]), int(parts["tp"])
    except (KeyError, ValueError) as exc:
        raise InputError(f"{where}: layout {text!r} is not 'dp=D,pp=P,tp=T'") from exc


def _link_range(block: Any) -> tuple[Link, Link] | None:
    """The probe's fast and slow links (an older trainer's summary has none)."""
    try:
        fast, slow = (Link(alpha_s=float(block[k]["alphaS"]), beta_bytes_per_s=float(block[k]["betaBytesPerS"]),
                           source="probe") for k in ("fast", "slow"))  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None
    return fast, slow


def _link(block: Any, where: str) -> tuple[Link | None, int]:
    if block is None:
        return None, 0
    alpha = _num(block, "alphaS", where + ": scaling.link")
    beta = _num(block, "betaBytesPerS", where + ": scaling.link")
    if beta <= 0 or alpha < 0:
        return None, 0
    return Link(alpha_s=alpha, beta_bytes_per_s=beta, source="probe"), int(_num(block, "worldSize", where))


def _pipeline(summary: dict[str, Any], block: dict[str, Any] | None, where: str) -> PipelineFacts | None:
    pipe = summary.get("pipeline")
    if not isinstance(pipe, dict):
        return None
    b = block or {}
    secs, outs = b.get("blockSeconds"), b.get("blockOutBytes")
    return PipelineFacts(
        schedule=str(_get(pipe, "schedule", str, where)),
        stages=int(_num(pipe, "stages", where)),
        microbatches=int(_num(pipe, "microbatches", where)),
        block_seconds=tuple(float(x) for x in secs) if isinstance(secs, list) and secs else None,
        block_out_bytes=tuple(int(x) for x in outs) if isinstance(outs, list) and outs else None,
        stage_compute_s=tuple(float(x) for x in b.get("stageComputeS") or ()),
        boundary_bytes=tuple(int(x) for x in b.get("boundaryBytes") or ()),
    )


def measured_from_summary(summary: dict[str, Any], *, source: str) -> Measured:
    """Parse a trainer summary (summary.json, or a job's status.result) into `Measured`."""
    where = source
    mode = summary.get("mode")
    if mode not in SYNCHRONOUS_MODES:
        raise InputError(f"{where}: mode {mode!r}: explain forecasts the synchronous layouts "
                         f"({', '.join(SYNCHRONOUS_MODES)}); federated and parameter-server jobs are not modelled")  # fmt: skip
    sc = summary.get("scaling")
    if not isinstance(sc, dict):
        raise InputError(f"{where}: the summary has no 'scaling' block (a trainer without the forecast inputs, or "
                         "a termination message cut short); rerun the job with this version of disttrain")  # fmt: skip
    _get(summary, "scaling.perStep", dict, where)
    if _num(summary, "scaling.perStep.stepS", where) <= 0:
        raise InputError(f"{where}: scaling.perStep.stepS is 0: the run measured no steps")
    def per(key: str) -> float:
        return _num(summary, f"scaling.perStep.{key}", where)

    steps = StepFigures(
        step_s=per("stepS"), data_s=per("dataS"), compute_s=per("computeS"), exposed_s=per("commExposedS"),
        busy_s=per("commBusyS"), idle_s=per("idleS"),
    )  # fmt: skip
    dp, pp, tp = _layout(str(_get(summary, "layout", str, where)), where)
    comp = sc.get("compression") or {}
    kind = comp.get("kind", "none")
    if kind not in COMPRESSIONS:
        raise InputError(f"{where}: scaling.compression.kind {kind!r} is not one of {COMPRESSIONS}")
    _get(summary, "scaling.host", dict, where)
    link, link_world = _link(sc.get("link"), where)
    link_range = _link_range(sc.get("link")) if link is not None else None
    tc = sc.get("tensorComm")
    tensor_comm = (int(tc["count"]), int(tc["bytes"]), str(tc.get("source", "measured"))) if isinstance(tc, dict) else None
    low = sc.get("lowRank") or {}
    return Measured(
        source=source, mode=str(mode), world_size=int(_num(summary, "worldSize", where)), dp=dp, pp=pp, tp=tp,
        data_strategy=str(summary.get("dataStrategy") or "ddp"), compression=kind,
        powersgd_rank=int(comp.get("rank") or 0), batch_per_replica=int(_num(summary, "scaling.batchPerReplica", where)),
        steps=steps, parameters=int(_num(summary, "scaling.parameters", where)),
        parameter_bytes=int(_num(summary, "scaling.parameterBytes", where)), gradient_bytes=int(_num(summary, "scaling.gradientBytes", where)),
        blocks=max(1, int(sc.get("blocks") or 1)), buckets=max(1, int(sc.get("buckets") or 1)),
        collectives={str(k): (int(v[0]), int(v[1])) for k, v in (sc.get("collectives") or {}).items()},
        wire_bytes=int(comp["wireBytes"]) if comp.get("wireBytes") is not None else None,
        ddp_calls=int(comp["calls"]) if comp.get("calls") else None, hook_blocks_backward=bool(comp.get("blocksBackward")),
        low_rank_bytes_per_rank=int(low.get("bytesPerRank") or 0), uncompressed_bytes=int(low.get("uncompressedBytes") or 0),
        tensor_comm=tensor_comm, tensor_limit=int(sc.get("tensorLimit") or 0),
        activation_bytes=int(sc.get("activationBytes") or 0), link=link, link_world=link_world, link_range=link_range,
        host=Host(cores=_num(summary, "scaling.host.cores", where),
                  ranks_on_host=int(_num(summary, "scaling.host.ranksOnHost", where)),
                  threads_per_rank=int(_num(summary, "scaling.host.threadsPerRank", where)), device=str(summary.get("device") or "cpu")),
        backend=str(summary.get("backend") or "gloo"), pipeline=_pipeline(summary, sc.get("pipeline"), where),
        sync_every=max(1, int(summary.get("syncEvery") or 1)),
    )  # fmt: skip
