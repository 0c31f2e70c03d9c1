"""`disttrain explain`'s output: the forecast table (text) and the efficiency plot (PNG)."""

from __future__ import annotations

from pathlib import Path

from disttrain_api.scaling import FAMILIES, Choice, Forecast, Point

PLOT_FILE = "scaling-forecast.png"


def _si(x: float) -> str:
    """3 significant digits with k/M/G: 37500 -> 37.5k."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{suffix}"
    return f"{x:.3g}"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def _cell(p: Point | None, fc: Forecast) -> str:
    if p is None:
        return "-"
    eff = f"{p.efficiency:.0%}" if p.efficiency >= 0.095 else f"{p.efficiency:.1%}"
    noise = f"±{fc.uncertainty(p):.0%}" if (p.n, p.family) in fc.spread else ""
    text = f"{_seconds(p.step_s)} {_si(p.samples_per_s)}/s{noise} {eff}"
    return f"{p.layout.describe()} {text}" if p.family == "hybrid" else text


VALIDATION = ("checked against measured runs on CPU (benchmarks/README.md, forecast_validation): world 4 from "
              "world 1 + 2 within 15% for data parallel, + PowerSGD, pipeline and tensor (medians; one run's "
              "step moves 10-20% on a busy host); from a DDP run, tensor and FSDP ran ~3x slower than forecast")


def format_table(fc: Forecast, choice: Choice | None) -> str:
    """N, then per family: step time, samples/s, efficiency; the choice, what is missing, the notes."""
    m, topo = fc.measured, fc.topology
    families = [f for f in FAMILIES if any((n, f) in fc.points for n in fc.sizes)]
    lines = [
        f"forecast from {m.label}",
        f"link: {topo.intra.describe()}"
        + (f"; between hosts of {topo.ranks_per_host} rank(s): {topo.inter.describe()}" if topo.inter is not topo.intra
           and topo.ranks_per_host < 1_000_000_000 else ""),
        "per layout family: step time, samples/s, efficiency (weak scaling: samples/s over N x one worker's)"
        + ("; ±: how far samples/s moves between the link probe's fast and slow quartiles" if fc.spread else ""),
    ]  # fmt: skip
    rows = [["N", *families]] + [[str(n), *(_cell(fc.points.get((n, f)), fc) for f in families)] for n in fc.sizes
                                 if n not in fc.refused]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, row in enumerate(rows):
        lines.append("  ".join(c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    if choice is not None:
        lines.append("")
        lines.append(f"fastest: {choice.reason}")
    for family, why in fc.missing.items():
        lines.append(f"not forecast: {family}: {why}")
    if fc.refused:
        first = min(fc.refused)
        lines.append(f"not forecast: N={', '.join(map(str, sorted(fc.refused)))}: from N={first}, {fc.refused[first]} "
                     "(--own-cores: every rank with cores of its own; --probe-host: measure this host there)")  # fmt: skip
    lines.append("assumptions:")
    lines += [f"  - {note}" for note in fc.notes]
    # Said on every table: how far the model held against measured runs, so that a user weighs a
    # modelled row accordingly (benchmarks/forecast_validation.py).
    lines.append(VALIDATION)
    return "\n".join(lines)


def write_plot(fc: Forecast, path: Path, *, target: int | None) -> Path | None:
    """Efficiency vs N per family, log-x; None (and no file) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: PLC0415 - matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # a file is the only output
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib

    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for family in FAMILIES:
            pts = [fc.points[(n, family)] for n in fc.sizes if (n, family) in fc.points]
            if len(pts) > 1 or (pts and pts[0].n > 1):
                ax.plot([p.n for p in pts], [p.efficiency * 100 for p in pts], marker="o", markersize=3, label=family)
        if target:
            ax.axvline(target, color="grey", linestyle=":", linewidth=1, label=f"target N={target}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers N")
        ax.set_ylabel("scaling efficiency, % (weak scaling)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, which="both")
        ax.set_title(f"forecast from {fc.measured.source}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path
