"""Forecast every layout family for N = 1 ... 1024 workers and name the fastest at a target size.

Families (one curve each): data parallel (DDP), with fp16 or PowerSGD compression, FSDP,
pipeline, tensor, and the best product of data x pipeline x tensor ("hybrid"). Efficiency is
weak scaling: samples/s at N over N x samples/s of one worker, every data-parallel replica
keeping the run's per-replica batch (model.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .collectives import Link, Topology
from .inputs import InputError, Measured
from .model import Breakdown, Calibrated, Layout, Placement, calibrate, infeasible, step_time

FAMILIES = ("data", "data+fp16", "data+powersgd", "fsdp", "pipeline", "tensor", "hybrid")
SIZES = tuple(2**k for k in range(11))  # 1 ... 1024


@dataclass(frozen=True, kw_only=True)
class Point:
    n: int
    family: str
    layout: Layout
    breakdown: Breakdown
    samples_per_s: float
    efficiency: float

    @property
    def step_s(self) -> float:
        return self.breakdown.step_s


@dataclass(frozen=True, kw_only=True)
class Choice:
    point: Point
    reason: str


@dataclass(frozen=True, kw_only=True)
class Forecast:
    measured: Measured
    calibrated: Calibrated
    topology: Topology
    placement: Placement
    sizes: tuple[int, ...]
    points: dict[tuple[int, str], Point]  # (n, family) -> the family's fastest layout at n
    missing: dict[str, str]  # family -> why it is not forecast at all
    notes: tuple[str, ...] = field(default_factory=tuple)
    refused: dict[int, str] = field(default_factory=dict)  # n -> why no layout is forecast at n (shared cores)
    # (n, family) -> (low, high) samples/s: the point forecast again with the probe's fast and slow
    # links (its quartiles): how far the start-up probe's noise alone moves it
    spread: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)

    def uncertainty(self, p: Point) -> float:
        """The relative half-width of a point's samples/s range (0 without a probe range)."""
        lo, hi = self.spread.get((p.n, p.family), (p.samples_per_s, p.samples_per_s))
        return max(hi - p.samples_per_s, p.samples_per_s - lo) / p.samples_per_s if p.samples_per_s else 0.0

    def distinct(self, a: Point, b: Point) -> bool:
        """Whether two points' ranges do not overlap: a difference beyond the probe's noise."""
        alo, ahi = self.spread.get((a.n, a.family), (a.samples_per_s,) * 2)
        blo, bhi = self.spread.get((b.n, b.family), (b.samples_per_s,) * 2)
        return alo > bhi or blo > ahi

    def row(self, n: int) -> dict[str, Point | None]:
        return {f: self.points.get((n, f)) for f in FAMILIES}

    def at(self, n: int) -> list[Point]:
        """Every family's point at n, the most samples/s first (weak scaling: layouts with more
        data-parallel replicas take more samples per step, so step time alone does not rank them)."""
        return sorted((p for (k, _), p in self.points.items() if k == n), key=lambda p: -p.samples_per_s)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(n: int, family: str) -> Iterable[Layout]:
    if family == "data":
        yield Layout(dp=n)
    elif family in ("data+fp16", "data+powersgd"):
        yield Layout(dp=n, compression=family.split("+")[1])
    elif family == "fsdp":
        yield Layout(dp=n, strategy="fsdp")
    elif family == "pipeline":
        yield Layout(pp=n)
    elif family == "tensor":
        yield Layout(tp=n)
    elif family == "hybrid":
        for tp in _divisors(n):
            for pp in _divisors(n // tp):
                dp = n // (tp * pp)
                if sum(d > 1 for d in (dp, pp, tp)) < 2:
                    continue
                yield Layout(dp=dp, pp=pp, tp=tp)
                if pp == 1:
                    yield Layout(dp=dp, pp=pp, tp=tp, strategy="fsdp")


def default_topology(m: Measured, *, link: Link | None, ranks_per_host: int | None,
                     host_links: dict[int, Link] | None = None) -> Topology:  # fmt: skip
    """Ranks on one host (`ranks_per_host` None): the given link, else the probe's, everywhere.
    Hosts of `ranks_per_host`: the probe's link inside a host, the given one between hosts.
    `host_links`: this host's links measured at given ring sizes (`--probe-host`)."""
    probe = m.link
    if probe is None and link is None:
        raise InputError(f"{m.source}: no link bandwidth: the run had one rank (nothing to probe) or no probe; "
                         "give one with --bandwidth GB/s (and --latency us)")  # fmt: skip
    measured = dict(host_links or {})
    if ranks_per_host is None:
        base = link or probe
        assert base is not None
        return Topology(ranks_per_host=1 << 30, intra=base, inter=base, measured=measured)
    inter = link or probe
    assert inter is not None
    return Topology(ranks_per_host=ranks_per_host, intra=probe or inter, inter=inter, measured=measured)


def default_placement(m: Measured, *, ranks_per_host: int | None, own_cores: bool) -> Placement:
    """As the run was placed: a run whose ranks all shared one host's CPU cores (a local run)
    keeps every forecast rank on those cores; otherwise `ranks_per_host` to a host."""
    h = m.host
    one_host = ranks_per_host is None and h.ranks_on_host >= m.world_size
    per_host = None if one_host else (ranks_per_host or h.ranks_on_host)
    cpu = h.device == "cpu" and not own_cores
    return Placement(cpu=cpu, cores=h.cores, threads_per_rank=h.threads_per_rank, ranks_per_host=per_host)


# Where ranks x threads exceed a CPU host's cores the fair-share contention model (every rank at
# cores / threads of its speed) missed measured steps by 61% and 64% (data parallel, 4 ranks on 2
# cores): gloo's ring waits for each receiver to be scheduled, and that grows with the run-queue in
# ways no smaller run shows. Such sizes are not forecast, unless --probe-host measured the ring there.
OVERSUBSCRIBED = ("{ranks} ranks x {threads} thread(s) on {cores:g} cores: more runnable threads than cores, where "
                  "the contention model is not reliable (it missed measured steps by over 60%)")


def oversubscribed(*, ranks: int, threads: int, cores: float) -> str | None:
    """Why a CPU host with `ranks` ranks of `threads` threads is not forecast, or None when it fits.
    One single-threaded rank under a fractional CPU quota (a 250m pod) is throttled, not contended:
    nothing shares its core, and every size's pods get the same quota, so it fits."""
    if cores <= 0 or ranks * max(1, threads) <= max(1.0, cores):
        return None
    return OVERSUBSCRIBED.format(ranks=ranks, threads=max(1, threads), cores=cores)


def check_run_fits(m: Measured) -> None:
    """A CPU run whose own ranks x threads exceeded its cores measured a step the model cannot
    take the contention out of: no forecast starts from it."""
    h = m.host
    why = oversubscribed(ranks=h.ranks_on_host, threads=h.threads_per_rank, cores=h.cores) if h.device == "cpu" else None
    if why is not None:
        raise InputError(f"{m.source}: the run itself had {why}; forecast from a run with ranks x threads <= cores "
                         "(fewer local ranks, or OMP_NUM_THREADS=1)")  # fmt: skip


def forecast(m: Measured, *, single: Measured | None = None, link: Link | None = None,
             ranks_per_host: int | None = None, own_cores: bool = False, sizes: Sequence[int] = SIZES,
             host_links: dict[int, Link] | None = None) -> Forecast:  # fmt: skip
    """Every family's fastest layout at each size (the pure entry point: a parsed run in, figures out),
    with each point's range when the run's probe has one (forecast again from its fast and slow
    links; a link the user gave has no range)."""
    check_run_fits(m)
    kw: dict[str, Any] = {"single": single, "link": link, "ranks_per_host": ranks_per_host, "own_cores": own_cores,
                          "sizes": sizes, "host_links": host_links}  # fmt: skip
    fc = _forecast(m, **kw)
    if link is not None or m.link_range is None:
        return fc
    others = [_forecast(dataclasses.replace(m, link=edge, link_range=None), **kw) for edge in m.link_range]
    spread = {}
    for key, p in fc.points.items():
        values = [p.samples_per_s, *(o.points[key].samples_per_s for o in others if key in o.points)]
        spread[key] = (min(values), max(values))
    return dataclasses.replace(fc, spread=spread)


def _forecast(m: Measured, *, single: Measured | None, link: Link | None, ranks_per_host: int | None,
              own_cores: bool, sizes: Sequence[int], host_links: dict[int, Link] | None) -> Forecast:  # fmt: skip
    place = default_placement(m, ranks_per_host=ranks_per_host, own_cores=own_cores)
    topo = default_topology(m, link=link, ranks_per_host=place.ranks_per_host, host_links=host_links)
    cal = calibrate(m, topo, place, single=single)
    one = step_time(cal, Layout(), topo, place)
    if single is not None:  # one worker was measured: that is N = 1, and the efficiencies' base
        st = single.steps
        one = Breakdown(step_s=st.step_s - st.idle_s, data_s=st.data_s, compute_s=st.compute_s, exposed_s=0.0, bubble_s=0.0)
    base = one.step_s
    points: dict[tuple[int, str], Point] = {}
    missing: dict[str, str] = {}
    refused: dict[int, str] = {}
    for n in sorted(set(sizes)):
        if place.cpu and not (host_links and n in host_links):
            on_host = n if place.ranks_per_host is None else min(n, place.ranks_per_host)
            why = oversubscribed(ranks=on_host, threads=place.threads_per_rank, cores=place.cores)
            if why is not None:
                refused[n] = why
                continue
        for family in FAMILIES:
            best: Point | None = None
            why = None
            for lay in candidates(n, family):
                why = infeasible(cal, lay)
                if why is not None:
                    continue
                bd = one if n == 1 else step_time(cal, lay, topo, place)
                samples = lay.dp * m.batch_per_replica / bd.step_s
                pt = Point(n=n, family=family, layout=lay, breakdown=bd, samples_per_s=samples,
                           efficiency=base * lay.dp / (n * bd.step_s))  # fmt: skip
                if best is None or pt.step_s < best.step_s:
                    best = pt
            if best is not None:
                points[(n, family)] = best
            elif why is not None and n > 1:
                missing.setdefault(family, why)
    for family in FAMILIES:  # N = 1 is one worker in every family: a family is forecast beyond it, or not at all
        if any(f == family and n > 1 for n, f in points):
            missing.pop(family, None)
        else:
            points.pop((1, family), None)
    return Forecast(measured=m, calibrated=cal, topology=topo, placement=place, sizes=tuple(sorted(set(sizes))),
                    points=points, missing=missing, notes=tuple(notes(m, cal, place, topo, single)),
                    refused=refused)  # fmt: skip


PARTS = (("data_s", "data"), ("compute_s", "compute"), ("exposed_s", "exposed communication"),
         ("bubble_s", "pipeline bubble"))  # fmt: skip


def best_at(fc: Forecast, n: int) -> Choice:
    """The layout with the most samples/s at n and a one-line reason: the part of the step that
    beats the runner-up (per sample of a replica's batch, when their data degrees differ)."""
    if n not in fc.sizes:
        raise ValueError(f"N={n} was not forecast (sizes {fc.sizes}): pass it in forecast(..., sizes=...)")
    if n in fc.refused:
        raise InputError(f"N={n} is not forecast: {fc.refused[n]}; --own-cores gives every rank cores of its own, "
                         "--probe-host measures this host at that size")  # fmt: skip
    ranked = fc.at(n)
    if not ranked:
        raise InputError(f"no layout can be forecast at N={n}")
    best = ranked[0]
    head = (f"{best.layout.describe()} ({best.family}) is fastest at N={n}: {best.samples_per_s:.4g} samples/s"
            f"{_range(fc, best)} ({best.step_s * 1e3:.3g} ms/step), efficiency {best.efficiency:.0%}")  # fmt: skip
    if len(ranked) == 1:
        return Choice(point=best, reason=head + " (the only layout forecast)")
    runner = ranked[1]
    # Seconds per step of one replica's batch: a layout with dp replicas takes dp batches per step.
    per = (1.0 / best.layout.dp, 1.0 / runner.layout.dp)
    gaps = [(getattr(runner.breakdown, k) * per[1] - getattr(best.breakdown, k) * per[0], k, name) for k, name in PARTS]
    _, key, name = max(gaps)
    unit = "ms" if best.layout.dp == runner.layout.dp else "ms per replica batch"
    why = (f"; {name} {getattr(best.breakdown, key) * per[0] * 1e3:.3g} {unit} against "
           f"{getattr(runner.breakdown, key) * per[1] * 1e3:.3g} for the next, {runner.layout.describe()} "
           f"({runner.samples_per_s:.4g} samples/s{_range(fc, runner)})")  # fmt: skip
    if (best.n, best.family) in fc.spread and not fc.distinct(best, runner):
        why += "; the two ranges overlap: within the link probe's noise, not a real difference"
    return Choice(point=best, reason=head + why)


def _range(fc: Forecast, p: Point) -> str:
    """' (low-high)' samples/s over the probe's range, or nothing without one."""
    if (p.n, p.family) not in fc.spread:
        return ""
    lo, hi = fc.spread[(p.n, p.family)]
    return f" (range {lo:.4g}-{hi:.4g}, ±{fc.uncertainty(p):.0%})"


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """Another layout at the run's own size: `gain` = its samples/s over the run's layout's - 1."""

    current: Point
    best: Point
    gain: float


def run_layout(m: Measured) -> Layout:
    return Layout(dp=m.dp, pp=m.pp, tp=m.tp, strategy=m.data_strategy, compression=m.compression)


def best_alternative(fc: Forecast, families: Iterable[str] = FAMILIES) -> Alternative | None:
    """The layout of `families` forecast fastest at the run's own world size, against the run's
    layout forecast there (so both carry the same model error); None when the run's layout is
    already the fastest or cannot be forecast. What an operator's hint says ("PowerSGD forecast
    +22% samples/s")."""
    m = fc.measured
    n = m.world_size
    if n not in fc.sizes:
        raise ValueError(f"N={n} (the run's size) was not forecast: include it in sizes")
    lay = run_layout(m)
    if infeasible(fc.calibrated, lay) is not None or n in fc.refused:
        return None
    base = step_time(fc.calibrated, Layout(), fc.topology, fc.placement).step_s
    bd = step_time(fc.calibrated, lay, fc.topology, fc.placement)
    current = Point(n=n, family="run", layout=lay, breakdown=bd, samples_per_s=lay.dp * m.batch_per_replica / bd.step_s,
                    efficiency=base * lay.dp / (n * bd.step_s))  # fmt: skip
    allowed = set(families)
    ranked = [p for p in fc.at(n) if p.layout != lay and p.family in allowed]
    if not ranked or ranked[0].samples_per_s <= current.samples_per_s:
        return None
    best = ranked[0]
    return Alternative(current=current, best=best, gain=best.samples_per_s / current.samples_per_s - 1)


def notes(m: Measured, cal: Calibrated, place: Placement, topo: Topology, single: Measured | None) -> list[str]:
    """What the forecast assumed, in words (printed under the table)."""
    out = [f"weak scaling: every data-parallel replica keeps {m.batch_per_replica} samples per step; "
           "pipeline and tensor split a replica's work"]  # fmt: skip
    if place.cpu and place.ranks_per_host is None:
        out.append(f"all ranks on this host's {place.cores:g} cores at {place.threads_per_rank} thread(s) each: "
                   "beyond one thread per core, compute and gloo's copies slow by ranks x threads / cores "
                   f"(the run itself: x{cal.c_run:.2g})")  # fmt: skip
    if m.dp > 1 and not cal.overlap_measured and m.pp == 1 and m.tp == 1:
        out.append("overlap of the gradient all-reduce with backward not measured: none assumed")
    if m.sync_every > 1:
        out.append(f"training.sync: the replicas synchronised every {m.sync_every} steps (localsgd / diloco): "
                   f"data-parallel layouts all-reduce the parameters once per {m.sync_every} steps")  # fmt: skip
    if m.dp <= 1:
        out.append("the run had no data-parallel replicas: no overlap or all-reduce overhead measured, none assumed")
    if m.compression != "powersgd" and "powersgd" in cal.wire_ratio:
        out.append(f"PowerSGD: bytes from the parameter shapes at rank {m.powersgd_rank or 2} "
                   f"({cal.wire_ratio['powersgd']:.1%} of the gradients); its compression compute not measured")  # fmt: skip
    if m.compression in ("fp16", "powersgd") and m.wire_bytes:
        out.append(f"{m.compression}: measured wire bytes {cal.wire_ratio[m.compression]:.1%} of the gradients, "
                   f"compression work {cal.residual_s.get(m.compression, 0.0) * 1e3:.3g} ms/step")  # fmt: skip
    if cal.hop_wait_s:
        out.append(f"data parallel: the single-rank run's buckets took {cal.residual_s.get(m.compression, 0.0) * 1e3:.3g} "
                   f"ms/step with no peer; the rest beyond the link model, {cal.hop_wait_s * 1e6:.3g} us per ring step, "
                   "was waiting for peers and grows with the ring's steps")  # fmt: skip
    elif m.dp > 1 and m.pp == 1 and m.tp == 1 and m.data_strategy == "ddp" and single is None:
        out.append("data parallel: communication beyond the link model taken as fixed work (no single-rank run of "
                   "the same compression to tell the buckets' own work from waiting for peers)")  # fmt: skip
    if m.tensor_comm and m.tensor_comm[2] != "measured":
        out.append("tensor-parallel collectives from Megatron's count for this model (not measured: the run had tensor 1)")
    if m.tp > 1 and single is None:
        out.append("tensor: compute assumed to split perfectly (no single-rank run to fit what tensor parallelism adds)")
    if cal.tp_overhead_s:
        out.append(f"tensor: {cal.tp_overhead_s * 1e3:.3g} ms per step and rank added by tensor parallelism at any "
                   "degree (fitted: the tensor run's compute less the single-rank compute / tensor)")  # fmt: skip
    if m.pipeline is not None and not m.pipeline.block_seconds:
        out.append("pipeline: blocks not profiled (resumed run): equal blocks assumed")
    if m.pipeline is not None and m.pipeline.schedule not in ("GPipe", "1F1B", "Naive"):
        out.append(f"pipeline: schedule {m.pipeline.schedule} modelled as 1F1B (its bubble is smaller)")
    if topo.measured:
        out.append("links measured on this host at " + ", ".join(f"N={n}" for n in sorted(topo.measured))
                   + " ranks (--probe-host) hold their contention; other sizes stretch the run's link by it")  # fmt: skip
    elif place.cpu and place.ranks_per_host is None:
        out.append("with more ranks than cores, a ring's latency grows faster than the contention factor (gloo "
                   "ranks wait to be scheduled): --probe-host measures this host's link at those sizes")  # fmt: skip
    out.append("evaluation and checkpoint pauses (idle) are not part of the forecast step")
    return out
