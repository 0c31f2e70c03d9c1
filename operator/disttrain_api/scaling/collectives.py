"""What one collective costs on a link: the alpha-beta (latency-bandwidth) model.

A message of S bytes between two ranks takes alpha + S / beta seconds (Hockney's model):
alpha is the per-message latency (software stack, NIC, a hop), beta the bandwidth of the
slowest link the message crosses. The classic ring algorithms (Patarasuk & Yuan 2009; what
NCCL's and gloo's rings do) cut a buffer of S bytes into N chunks of S / N and pass chunks
around the ring of N ranks:

  reduce-scatter: N - 1 steps, each rank sends one chunk per step
                  -> (N - 1) x alpha + (N - 1) / N x S / beta
  all-gather:     the same N - 1 steps with the reduced chunks (S = the gathered size)
                  -> (N - 1) x alpha + (N - 1) / N x S / beta
  all-reduce:     reduce-scatter then all-gather
                  -> 2 (N - 1) x alpha + 2 (N - 1) / N x S / beta

`calls` separate collectives (DDP's gradient buckets, one per FSDP unit, one per
tensor-parallel layer) each pay the latency term; their bytes add up.

A ring that spans hosts crosses each host boundary once per direction, so every step's
time is set by the slowest hop: the network link between hosts, or the host's own link
(NVLink, shared memory) while the whole ring fits in one host (`Topology.link_for`).
That is the bottleneck-hop model of NCCL's rings; NCCL's trees only lower the latency term.

On a CPU host the "link" is the processor copying memory (gloo sends over loopback TCP), and
every rank's compute and copies share the host's cores: with more runnable threads than
cores each runs at cores / threads of its speed (`contention`).

Pure arithmetic: the operator, the CLI and the trainer all use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Link:
    """A link of the alpha-beta model; `source` says where the figures come from."""

    alpha_s: float  # latency per message, seconds
    beta_bytes_per_s: float  # bandwidth, bytes per second
    source: str = "given"  # "probe" (the job's ranks), "host" (N local ranks) or "given" (by the user)
    # Measured with the forecast's own number of ranks sharing the cores: its times already hold
    # that contention, which the model must not add again.
    contended: bool = False

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or self.beta_bytes_per_s <= 0:
            raise ValueError(f"a link needs latency >= 0 and bandwidth > 0 (got alpha {self.alpha_s} s, "
                             f"beta {self.beta_bytes_per_s} B/s)")  # fmt: skip

    def describe(self) -> str:
        return f"{self.beta_bytes_per_s / 1e9:.3g} GB/s, {self.alpha_s * 1e6:.3g} us latency ({self.source})"


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Ranks grouped into hosts: `intra` links the ranks of one host, `inter` the hosts;
    `measured`: links measured on this host at given ring sizes (contended ones)."""

    ranks_per_host: int
    intra: Link
    inter: Link
    measured: dict[int, Link] = field(default_factory=dict)

    def link_for(self, ranks: int, *, measured: bool = True) -> Link:
        """The bottleneck link of a ring over `ranks` consecutive ranks (see the module docstring);
        a link measured at exactly that ring size wins unless `measured` is False."""
        if measured and ranks in self.measured:
            return self.measured[ranks]
        return self.intra if ranks <= self.ranks_per_host else self.inter


def all_reduce_s(n: int, nbytes: float, link: Link, *, calls: int = 1) -> float:
    """Ring all-reduce of `nbytes` (per rank) over `n` ranks, split into `calls` collectives."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.alpha_s * calls + 2 * (n - 1) / n * nbytes / link.beta_bytes_per_s


def all_gather_s(n: int, nbytes: float, link: Link, *, calls: int = 1) -> float:
    """Ring all-gather whose result is `nbytes` on every rank (each contributes nbytes / n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.alpha_s * calls + (n - 1) / n * nbytes / link.beta_bytes_per_s


def reduce_scatter_s(n: int, nbytes: float, link: Link, *, calls: int = 1, native: bool = True) -> float:
    """Ring reduce-scatter of an `nbytes` buffer. gloo has no reduce-scatter of its own: torch runs it
    as an all-reduce of the whole buffer (`native=False`), twice the time."""
    if not native:
        return all_reduce_s(n, nbytes, link, calls=calls)
    return all_gather_s(n, nbytes, link, calls=calls)


def p2p_s(nbytes: float, link: Link, *, messages: int = 1) -> float:
    """`messages` point-to-point sends of `nbytes` each, one after the other."""
    if nbytes <= 0 or messages <= 0:
        return 0.0
    return messages * (link.alpha_s + nbytes / link.beta_bytes_per_s)


def contention(*, ranks_on_host: int, threads_per_rank: int, cores: float) -> float:
    """How much slower every rank runs when a host's runnable threads outnumber its cores.

    The scheduler shares the cores fairly, so each thread gets cores / threads of one; below
    one thread per core nothing slows (1.0). Only for CPU ranks: a GPU rank's work runs on its GPU."""
    if cores <= 0:
        return 1.0
    return max(1.0, ranks_on_host * max(1, threads_per_rank) / cores)


def fit_link(n: int, samples: Sequence[tuple[float, float]], *, source: str = "probe") -> Link:
    """alpha and beta from timed all-reduces over `n` ranks: `samples` = (bytes per rank, seconds).

    The ring all-reduce time is linear in the bytes: t = a + s x S with a = 2 (n - 1) alpha and
    s = 2 (n - 1) / n / beta, so an ordinary least-squares line through the samples gives both.
    Noise can tilt a line through few points: a negative intercept (alpha) is replaced by the
    smallest message's time less its bytes term, and a non-positive slope by the largest
    message's bytes over its time."""
    pts = sorted((float(b), float(t)) for b, t in samples if b > 0 and t > 0)
    if n < 2 or len(pts) < 2:
        raise ValueError(f"fitting a link needs n >= 2 ranks and two message sizes (got n={n}, {len(pts)} sizes)")
    k = len(pts)
    mx = sum(b for b, _ in pts) / k
    my = sum(t for _, t in pts) / k
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    slope = sum((b - mx) * (t - my) for b, t in pts) / sxx if sxx > 0 else 0.0
    wire = 2 * (n - 1) / n  # bytes on the wire per byte of buffer
    if slope <= 0:
        slope = pts[-1][1] / pts[-1][0]
    beta = wire / slope
    intercept = my - slope * mx
    if intercept < 0:
        intercept = max(0.0, pts[0][1] - slope * pts[0][0])
    return Link(alpha_s=intercept / (2 * (n - 1)), beta_bytes_per_s=beta, source=source)
