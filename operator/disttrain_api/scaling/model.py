"""Step time of one layout at N workers, from one run's measurements.

Weak scaling: every data-parallel replica keeps the run's batch (`batch_per_replica`);
pipeline and tensor parallelism split one replica's work over their ranks. A layout is
(dp, pp, tp), dp x pp x tp = N, its data dimension synchronised by DDP (optionally
compressed: fp16, PowerSGD) or FSDP. All figures are per step and rank, first at full
speed; c(N) (collectives.contention, 1 on GPUs) then stretches them: on a CPU host with
fewer cores than runnable threads, compute and the memory copies that move gloo's bytes
slow down alike. The run's own measurements are brought to full speed by dividing by the
run's c.

  step = c(N) x [ data + compute + exposed communication ]     (pp = 1)
  step = c(N) x [ data + dp all-reduce ] + max(span, c(N) x busy)     (pp > 1)

A link measured on this host at the forecast's own ring size (`Topology.measured`, from
`disttrain explain --probe-host`) already holds the contention: its collectives are not
stretched again.

- compute = C / tp + O_tp (tp > 1): C is one replica's compute on one rank (Megatron splits
  every matrix product tp ways); O_tp is what tensor parallelism adds per rank whatever its
  degree (DTensor's dispatch of every operator, the same operators at any tp), fitted as
  C(2) - C / 2 when a single-rank run gives C, else 0.
- DDP: the gradient all-reduce runs during backward, bucket by bucket. Its time
  busy = R + ring all-reduce(dp, wire bytes, calls) + 2 (dp - 1) x calls x H, R being the work
  of the buckets that does not grow with N (bucket copies, casts, PowerSGD's matrix products)
  and wire = gradient bytes x the compression's measured ratio. H is what a ring step waits
  beyond the link's latency for its peer while the ranks train (they reach each collective at
  different moments; a rank woken by a message has to be scheduled first), which a probe of
  idle ranks does not see and which grows with the ring's steps as latency does. With a
  single-rank run of the same compression R is measured there (its DDP timer has no peer to
  wait for) and H = (the run's communication - R - the link model) / (2 (dp - 1) x calls);
  H is negative (down to minus the latency) where the run's ring steps took less than its
  link probe's latency says: the probe, a few seconds at start-up, is the noisier figure
  (measured: a 2-rank probe of 1.6 ms per step in a run whose two ring steps took 1.2 ms in
  all forecast world 4 at +142%). Without one, all of the unexplained time is R and H = 0 (measured,
  benchmarks/forecast_validation.py: PowerSGD's three small all-reduces a step waited 0.43 ms
  per ring step at 2 ranks, 4.6 x the probe's latency). Only
  the part beyond the window in which backward still computes is exposed: that window W is
  the run's measured overlap (busy - exposed), scaled with the compute, or 0 where the
  hook holds up backward (PowerSGD on gloo); the last bucket, produced at the end of
  backward, never hides: exposed = max(busy - W, busy / calls).
- localsgd / diloco (training.sync, `sync_every` H > 1): the replicas step alone and all-reduce
  their parameters (or pseudo-gradients, the same bytes) once per H steps, after a step, with
  nothing to overlap: exposed = all-reduce(dp, parameter bytes) / H per step.
- FSDP (ZeRO-3): per step two all-gathers of the parameters (forward, and again in backward
  after resharding) and a reduce-scatter of the gradients, one collective per unit (each
  block and the root); FSDP prefetches the next unit's all-gather during the current
  unit's compute, so all but one unit's share can hide: exposed = max(comm - compute,
  comm / units).
- tensor (Megatron): the collectives per step (count, bytes; two all-reduces of the
  activations per layer forward, two backward), each a ring over the tp ranks, all on the
  critical path.
- pipeline: pipeline_time.makespan over a min-max split of the profiled block times
  (scaled so that they add up to the run's measured stage compute), each boundary adding
  two point-to-point messages (activation forward, gradient back) per micro-batch, each
  stage a per-slot overhead fitted at the run (schedule bookkeeping the formula does not
  see). Replicas then all-reduce the largest stage's gradients, nothing overlapping it. On a
  shared CPU host (c(N) > 1) the pp stages share pp / c(N) cores: a stage that waits in the
  bubble leaves its core to the others, and the critical path slows where more stages can
  run than there are cores. The makespan is then 1F1B's dependency graph simulated under
  fair sharing (pipeline_time.time_shared_makespan; backward twice the forward). Measured,
  benchmarks/forecast_validation.py, 4 stages of the GPT example on 2 cores, two rounds:
  390 and 334 ms; simulated 317 and 353 ms, where the longer of the span at full speed and
  c(N) x one stage's work (the work and span bounds) had given 232 and 248 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import collectives as col
from .collectives import Link, Topology
from .inputs import Measured
from .pipeline_time import makespan, min_max_split, time_shared_makespan


@dataclass(frozen=True, kw_only=True)
class Layout:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    strategy: str = "ddp"  # how the data dimension synchronises: "ddp" | "fsdp"
    compression: str = "none"  # DDP's gradient compression: "none" | "fp16" | "powersgd"

    @property
    def n(self) -> int:
        return self.dp * self.pp * self.tp

    def describe(self) -> str:
        dims = [f"{k}{v}" for k, v in (("dp", self.dp), ("pp", self.pp), ("tp", self.tp)) if v > 1] or ["dp1"]
        extra = " fsdp" if self.strategy == "fsdp" else "" if self.compression == "none" else f" {self.compression}"
        return "x".join(dims) + extra


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where N ranks run: on the measured host's cores (`ranks_per_host` None: all of them
    there, as in a local run) or `ranks_per_host` to a host, hosts added as N grows."""

    cpu: bool
    cores: float
    threads_per_rank: int
    ranks_per_host: int | None

    def contention(self, n: int) -> float:
        if not self.cpu:
            return 1.0
        on_host = n if self.ranks_per_host is None else min(n, self.ranks_per_host)
        return col.contention(ranks_on_host=on_host, threads_per_rank=self.threads_per_rank, cores=self.cores)


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    step_s: float
    data_s: float
    compute_s: float
    exposed_s: float  # communication nothing overlaps (tensor, data parallel)
    bubble_s: float  # pipeline: the rest of the makespan (waiting for other stages, P2P, schedule)


@dataclass(frozen=True, kw_only=True)
class Calibrated:
    """The run's constants at full speed (c = 1): what `step_time` combines per layout."""

    m: Measured
    c_run: float
    data_s: float
    replica_compute_s: float  # C
    tp_overhead_s: float  # O_tp
    overlap_s: float  # W: backward compute overlapping DDP's all-reduce in the run
    overlap_measured: bool
    residual_s: dict[str, float]  # R per compression kind where measured
    hop_wait_s: float  # H: a ring step's wait for its peer beyond the link's latency, while training
    wire_ratio: dict[str, float]  # wire bytes / gradient bytes per compression kind
    tp_count: int
    tp_bytes: int
    block_s: tuple[float, ...]  # per micro-batch of the run's size, calibrated (pipeline)
    block_out: tuple[int, ...]
    slot_overhead_s: float
    microbatches: int


def _span(layout: Layout, dim: str) -> int:
    """Consecutive ranks a group spans (rank = (d x pp + p) x tp + t): what decides its link."""
    return {"tp": layout.tp, "pp": layout.pp * layout.tp, "dp": layout.n}[dim]


def _tp_time(n: int, nbytes: float, count: int, topo: Topology, *, measured: bool = True) -> float:
    return col.all_reduce_s(n, nbytes, topo.link_for(n, measured=measured), calls=count) if n > 1 else 0.0


def calibrate(m: Measured, topo: Topology, placement: Placement, *, single: Measured | None = None) -> Calibrated:
    """Normalise the run to full speed and fit the constants the formulas do not give.

    `single`: a run of the same model and replica batch on one rank: its compute is C."""
    c = placement.contention(m.world_size)
    run = Layout(dp=m.dp, pp=m.pp, tp=m.tp, strategy=m.data_strategy, compression=m.compression)
    # The run's own communication is modelled on the link it measured (a link the user gives is
    # the target's, not the run's).
    topo = Topology(ranks_per_host=1 << 30, intra=m.link, inter=m.link) if m.link else topo
    st = m.steps
    single_c = single.steps.compute_s / placement.contention(1) if single is not None else None
    tp_count, tp_bytes = (m.tensor_comm[0], m.tensor_comm[1]) if m.tensor_comm else (0, 0)
    blocking = m.hook_blocks_backward and m.dp > 1
    # --- compute
    overhead = 0.0
    if m.pp > 1 and m.pipeline is not None and m.pipeline.stage_compute_s:
        replica = sum(m.pipeline.stage_compute_s) / c
    elif m.tp > 1:
        # The profiler's exposed time of tensor-parallel collectives is an upper bound (Python
        # between operators counts): the collectives take what the link model says, the rest
        # of the step's work is compute.
        split = max((st.compute_s + st.exposed_s) / c - _tp_time(m.tp, tp_bytes, tp_count, topo, measured=False), 0.0)
        replica = single_c if single_c else split * m.tp
        overhead = max(0.0, split - replica / m.tp)
    elif m.sync_every > 1:  # localsgd / diloco: the steps compute alone, the syncs are communication
        replica = st.compute_s / c
    elif blocking:  # the hook's time sits inside the step's compute: take it out
        replica = (st.compute_s - (st.busy_s - st.exposed_s)) / c
    else:
        replica = st.compute_s / c
    # --- data parallel
    ratio = {"none": 1.0, "fp16": 0.5}
    if m.low_rank_bytes_per_rank and m.gradient_bytes:
        r = m.powersgd_rank or 2
        ratio["powersgd"] = min(1.0, (r * m.low_rank_bytes_per_rank + m.uncompressed_bytes) / m.gradient_bytes)
    if m.wire_bytes and m.gradient_bytes and m.pp == 1 and m.tp == 1:
        ratio[m.compression] = m.wire_bytes / m.gradient_bytes
    residual: dict[str, float] = {}
    overlap, measured_overlap, hop_wait = 0.0, False, 0.0
    if m.dp > 1 and m.pp == 1 and m.tp == 1 and m.data_strategy == "ddp" and m.sync_every == 1:
        # DDP's timer: busy = first bucket launched .. last all-reduce done; exposed = end of
        # backward compute .. that end; so busy - exposed = W, the window in which backward
        # computed while buckets went out. A hook that holds up backward has no window: its
        # whole busy time is the step's (the trainer counted it as compute, taken out above).
        exposed = st.busy_s if blocking else st.exposed_s
        overlap = 0.0 if blocking else max(0.0, st.busy_s - st.exposed_s) / c
        calls = ddp_calls(m, m.compression)
        # The communication itself: busy when it was the bottleneck (the link never idled from
        # the first launch), the last bucket's exposed tail x calls when it kept up with backward
        # (busy then also holds the gaps waiting for buckets): the smaller of the two.
        comm = min(st.busy_s, exposed * calls) / c
        wire = m.gradient_bytes * ratio.get(m.compression, 1.0)
        model = col.all_reduce_s(m.dp, wire, topo.link_for(_span(run, "dp"), measured=False), calls=calls)
        own = _buckets_own_work(single, m, placement)
        if own is None:
            residual[m.compression] = max(0.0, comm - model)
        else:
            residual[m.compression] = own
            # Negative when the run's ring steps took less than the probe's latency (the probe,
            # a few seconds at start-up, is the noisier figure): down to a step of no latency.
            alpha = topo.link_for(_span(run, "dp"), measured=False).alpha_s
            hop_wait = max(-alpha, (comm - own - model) / (2 * (m.dp - 1) * calls))
        measured_overlap = True
    # --- pipeline
    block_s: tuple[float, ...] = ()
    block_out: tuple[int, ...] = ()
    slot, micro = 0.0, 1
    if m.pipeline is not None:
        block_s, block_out, slot, micro = _calibrate_pipeline(m, topo, c, replica)
        if single_c:  # layouts without a pipeline compute whole batches, as the single-rank run did
            replica = single_c
    return Calibrated(
        m=m, c_run=c, data_s=st.data_s / c, replica_compute_s=replica, tp_overhead_s=overhead, overlap_s=overlap,
        overlap_measured=measured_overlap, residual_s=residual, hop_wait_s=hop_wait, wire_ratio=ratio, tp_count=tp_count,
        tp_bytes=tp_bytes, block_s=block_s, block_out=block_out, slot_overhead_s=slot, microbatches=micro,
    )  # fmt: skip


def _buckets_own_work(single: Measured | None, m: Measured, placement: Placement) -> float | None:
    """R measured directly: DDP's busy time in a single-rank run of the same gradient compression,
    at full speed (its all-reduces have no peer: what it times is the buckets' own work)."""
    if single is None or single.world_size != 1 or single.compression != m.compression:
        return None
    return single.steps.busy_s / placement.contention(1)


def ddp_calls(m: Measured, compression: str) -> int:
    """All-reduce calls per step: the run's census for its own kind, else per bucket (PowerSGD: 3)."""
    if compression == m.compression and m.ddp_calls:
        return m.ddp_calls
    return m.buckets * (3 if compression == "powersgd" else 1)


def _calibrate_pipeline(m: Measured, topo: Topology, c: float, replica: float
                        ) -> tuple[tuple[float, ...], tuple[int, ...], float, int]:  # fmt: skip
    """Block costs scaled so their sum is the run's measured stage compute, and the per-slot
    overhead that makes the makespan reproduce the run's measured step."""
    pf = m.pipeline
    assert pf is not None
    micro = 1 if pf.schedule == "Naive" else pf.microbatches
    if pf.block_seconds and pf.block_out_bytes and sum(pf.block_seconds) > 0:
        k = replica / (micro * sum(pf.block_seconds))
        blocks = tuple(k * s for s in pf.block_seconds)
        outs = pf.block_out_bytes
    else:  # not profiled: equal blocks, each boundary carrying the measured bytes
        blocks = tuple(replica / (micro * m.blocks) for _ in range(m.blocks))
        mean_out = sum(pf.boundary_bytes) // len(pf.boundary_bytes) if pf.boundary_bytes else 0
        outs = tuple(mean_out for _ in range(m.blocks))
    lay = Layout(dp=m.dp, pp=m.pp, tp=m.tp)
    span = _pipeline(blocks, outs, lay, topo, micro=micro, slot=0.0)
    measured = (m.steps.step_s - m.steps.data_s) / c - _dp_allreduce(lay, topo, m.gradient_bytes)
    slot = max(0.0, (measured - span) / (micro + m.pp - 1))
    return blocks, outs, slot, micro


# A micro-batch's backward costs about twice its forward (two matrix products per one: the
# gradients of the inputs and of the weights); only the time-shared schedule needs the split.
BACKWARD_SHARE = 2 / 3


def _pipeline(blocks: tuple[float, ...], outs: tuple[int, ...], lay: Layout, topo: Topology, *, micro: int,
              slot: float, tp_scale: float = 1.0, tp_per_block: float = 0.0, c: float = 1.0) -> float:  # fmt: skip
    """The makespan of the min-max split of `blocks` over lay.pp stages, its stages running at full
    speed (c = 1) or sharing the cores with contention c > 1 (pp / c cores for the pp stages)."""
    link = topo.link_for(_span(lay, "pp"), measured=False)
    costs = [b * tp_scale + tp_per_block for b in blocks]
    cut = [2 * col.p2p_s(o, link) for o in outs]  # activation forward, its gradient back
    bounds = min_max_split(costs, lay.pp, cut_cost=cut)
    if c <= 1:
        stage = [sum(costs[a:b]) + (cut[b - 1] if b < len(costs) else 0.0) + slot for a, b in bounds]
        return makespan(stage, microbatches=micro)
    work = [sum(costs[a:b]) + slot for a, b in bounds]
    message = max((cut[b - 1] / 2 for _, b in bounds[:-1]), default=0.0)
    return time_shared_makespan([(1 - BACKWARD_SHARE) * w for w in work], [BACKWARD_SHARE * w for w in work],
                                microbatches=micro, cores=lay.pp / c, message_s=message)  # fmt: skip


def _dp_allreduce(lay: Layout, topo: Topology, grad_bytes: float) -> float:
    """Replicas all-reduce one stage's gradients after the pipeline step (the largest share)."""
    if lay.dp <= 1:
        return 0.0
    return col.all_reduce_s(lay.dp, grad_bytes / lay.pp, topo.link_for(_span(lay, "dp"), measured=False))


def infeasible(cal: Calibrated, lay: Layout) -> str | None:
    """Why `lay` cannot be forecast from this run, or None."""
    m = cal.m
    if lay.tp > 1:
        if not cal.tp_count:
            return "no tensor-parallel collectives measured or known for this model"
        if m.tensor_limit and m.tensor_limit % lay.tp:
            return f"tensor {lay.tp} does not divide the model ({m.tensor_limit})"
    if lay.pp > 1:
        if not cal.block_s and not m.activation_bytes:
            return "no profiled blocks and no activation size for this model"
        if lay.pp > max(len(cal.block_s), m.blocks):
            return f"{lay.pp} stages: more than the model's {max(len(cal.block_s), m.blocks)} blocks"
    if lay.compression != "none":
        if lay.pp > 1 or lay.tp > 1 or lay.strategy != "ddp":
            return "gradient compression applies to plain data parallel"
        if lay.compression not in cal.wire_ratio:
            return f"{lay.compression}: no compression ratio measured or known"
    return None


def _wall(link: Link, seconds: float, c: float) -> float:
    """Communication seconds at full speed on `link` -> wall seconds at contention c (a link measured
    under that contention already holds it)."""
    return seconds if link.contended else c * seconds


def step_time(cal: Calibrated, lay: Layout, topo: Topology, placement: Placement) -> Breakdown:
    """The forecast step of `lay` (see the module docstring for every term), in wall seconds."""
    m = cal.m
    c = placement.contention(lay.n)
    compute = cal.replica_compute_s / lay.tp + (cal.tp_overhead_s if lay.tp > 1 else 0.0)
    tp_link = topo.link_for(lay.tp)
    tp_comm = _tp_time(lay.tp, cal.tp_bytes, cal.tp_count, topo)
    if lay.pp == 1:
        exposed = _wall(tp_link, tp_comm, c) + _data_exposed(cal, lay, topo, compute, c)
        return Breakdown(step_s=c * (cal.data_s + compute) + exposed, data_s=c * cal.data_s, compute_s=c * compute,
                         exposed_s=exposed, bubble_s=0.0)  # fmt: skip
    # Pipelines: the makespan's transfers and the replicas' all-reduce on the links at full speed;
    # the replicas' all-reduce and the data stretched by c, the makespan shared as below.
    blocks, outs, micro = cal.block_s, cal.block_out, cal.microbatches
    if not blocks:  # a run without a pipeline: equal blocks, a layer's activation at each cut
        micro = lay.pp
        blocks = tuple(cal.replica_compute_s / (micro * m.blocks) for _ in range(m.blocks))
        outs = tuple(m.activation_bytes // micro for _ in range(m.blocks))
    tp_base = _tp_time(lay.tp, cal.tp_bytes, cal.tp_count, topo, measured=False)
    per_block = (tp_base + cal.tp_overhead_s) / (micro * len(blocks)) if lay.tp > 1 else 0.0
    # With more runnable ranks than cores (c > 1) a stage waiting in the bubble leaves its core to
    # the others and the critical path slows where more stages can run than there are cores: the
    # schedule simulated under the scheduler's fair sharing (pipeline_time.time_shared_makespan).
    makespan = _pipeline(blocks, outs, lay, topo, micro=micro, slot=cal.slot_overhead_s, tp_scale=1.0 / lay.tp,
                         tp_per_block=per_block, c=c)  # fmt: skip
    allreduce = _dp_allreduce(lay, topo, m.gradient_bytes / lay.tp)
    own = compute / lay.pp + tp_base / lay.pp  # this rank's own work inside the makespan
    return Breakdown(step_s=c * (cal.data_s + allreduce) + makespan, data_s=c * cal.data_s, compute_s=c * compute / lay.pp,
                     exposed_s=c * (allreduce + tp_base / lay.pp), bubble_s=max(0.0, makespan - c * own))  # fmt: skip


def _data_exposed(cal: Calibrated, lay: Layout, topo: Topology, compute: float, c: float) -> float:
    """Exposed wall seconds of the data dimension's synchronisation (pp = 1) at contention c."""
    m = cal.m
    if lay.dp <= 1:
        return 0.0
    link = topo.link_for(_span(lay, "dp"))
    scale = compute / cal.replica_compute_s if cal.replica_compute_s > 0 else 1.0  # the window shrinks with compute
    if lay.strategy == "fsdp":
        units = max(1, m.blocks - 1)  # each transformer/MLP block and the root (parallel/fsdp.py)
        params, grads = m.parameter_bytes / lay.tp, m.gradient_bytes / lay.tp
        comm = _wall(link, 2 * col.all_gather_s(lay.dp, params, link, calls=units) + col.reduce_scatter_s(
            lay.dp, grads, link, calls=units, native=m.backend != "gloo"), c)  # fmt: skip
        return max(comm - c * compute, comm / units)
    if m.sync_every > 1 and lay.tp == 1 and lay.compression == "none":
        # localsgd / diloco: one all-reduce of the parameters every sync_every steps, after the
        # step, nothing overlapping it: per step, its share.
        return _wall(link, col.all_reduce_s(lay.dp, m.parameter_bytes, link), c) / m.sync_every
    calls = ddp_calls(m, lay.compression)
    wire = m.gradient_bytes / lay.tp * cal.wire_ratio[lay.compression]
    # A kind the run did not use keeps the plain run's residual (bucket copies happen whatever is sent).
    residual = cal.residual_s.get(lay.compression, cal.residual_s.get("none", 0.0))
    steps = 2 * (lay.dp - 1) * calls  # ring steps per training step
    if link.contended:
        # A link probed under the target's contention already holds the ranks' wait to be scheduled,
        # one part of H on shared cores, so the two are not added: a ring step takes the longer of
        # the probed latency and the run's latency plus H, both at the ranks' speed.
        base = topo.link_for(_span(lay, "dp"), measured=False).alpha_s
        waits = steps * max(0.0, c * (base + cal.hop_wait_s) - link.alpha_s)
    else:
        waits = steps * c * max(cal.hop_wait_s, -link.alpha_s)
    busy = c * residual + waits + _wall(link, col.all_reduce_s(lay.dp, wire, link, calls=calls), c)
    hook_blocks = lay.compression == "powersgd" and m.host.device == "cpu"
    window = 0.0 if hook_blocks else c * cal.overlap_s * scale
    return max(busy - window, busy / calls)
