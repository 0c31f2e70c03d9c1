"""The end of a local run: a summary (printed and saved) and a PNG of the run.

Figures come from what the trainer wrote (rank 0's summary.json and JSON-lines
log); the launcher adds only what it alone knows: restarts, its own wall time,
and why it failed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from disttrain_trainer.process.config import SUMMARY_FILE  # written by the trainer's rank 0

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LOCAL_SUMMARY_FILE = "local-summary.json"  # written by the launcher
PLOT_FILE = "training.png"
# The stacked categories of a step (they add up to its wall time) in every mode; busy communication
# overlaps compute, so it is drawn as a line, not stacked.
BREAKDOWN_KEYS = (
    ("compute_s", "compute"),
    ("comm_exposed_s", "communication, exposed (waited for)"),
    ("data_s", "data"),
    ("idle_s", "idle (waiting while another rank or process works alone)"),
)
BUSY_KEY = ("comm_busy_s", "communication, busy (in flight, overlaps compute)")
# At most this many bars per category in the time panel: a run that logs every step for hours
# (40 000 records) is drawn as means over runs of consecutive records. The panel is ~700 pixels
# wide, and matplotlib spends minutes and gigabytes on a bar per record.
MAX_BARS = 400
# Inches from a panel's bottom edge down to its legend: room for the tick labels and the x label.
LEGEND_DROP_IN = 0.5


def _num(d: dict[str, Any] | None, *keys: str) -> float | None:
    for key in keys:
        value = (d or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def dedupe_by_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step records, one per step, the latest winning: a resumed attempt re-logs steps after its checkpoint."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in records:
        if "event" in r:  # checkpoint/eval events share the log but are not step records
            continue
        step = _num(r, "step")
        if step is not None:
            by_step[int(step)] = r
    return [by_step[s] for s in sorted(by_step)]


def fraction_of(records: list[dict[str, Any]], key: str) -> float | None:
    """Seconds under `key` / step seconds over the records (each the per-step mean of `steps` steps);
    None when no record has `key` (a private federated run does not release its time split)."""
    if not any(_num(r, key) is not None for r in records):
        return None
    part = sum((_num(r, key) or 0.0) * (_num(r, "steps") or 1.0) for r in records)
    step = sum((_num(r, "step_s") or 0.0) * (_num(r, "steps") or 1.0) for r in records)
    return part / step if step > 0 else None


@dataclass(frozen=True, kw_only=True)
class LocalSummary:
    job: str
    status: str  # Succeeded | Failed | Interrupted
    reason: str | None
    steps: int | None
    total_steps: int
    final_loss: float | None
    test_accuracy: float | None
    val_loss: float | None
    wall_s: float
    train_wall_s: float | None
    comm_exposed_fraction: float | None  # the step waited on communication
    comm_busy_fraction: float | None  # a collective in flight (overlaps compute)
    idle_fraction: float | None  # waiting while rank 0 worked alone
    restarts: int
    world_size: int
    device: str
    resumed_from_step: int | None
    run_dir: str
    plot: str | None = None
    export: str | None = None  # where the trainer exported the final model (its summary's export.path)
    # Pipeline modes: one entry per stage (the trainer's pipeline.perStage), else None.
    per_stage: list[dict[str, Any]] | None = None


def build_summary(
    *,
    job: str,
    status: str,
    reason: str | None,
    trainer: dict[str, Any] | None,
    records: list[dict[str, Any]],
    total_steps: int,
    wall_s: float,
    restarts: int,
    world_size: int,
    device: str,
    run_dir: Path,
    plot: Path | None,
) -> LocalSummary:
    last = records[-1] if records else None
    steps = _num(trainer, "steps")
    if steps is None:
        steps = _num(last, "step")
    fractions = {
        "comm_exposed_s": _num(trainer, "commExposedFraction"),
        "comm_busy_s": _num(trainer, "commBusyFraction"),
        "idle_s": _num(trainer, "idleFraction"),
    }
    resumed = _num(trainer, "resumedFromStep")
    # A resumed finished run reports the finished run's summary (the trainer keeps it
    # with the final checkpoint), so these are always that training's own figures.
    final_loss = _num(trainer, "finalLoss")
    if final_loss is None or math.isnan(final_loss):
        final_loss = _num(last, "loss")
    return LocalSummary(
        job=job,
        status=status,
        reason=reason,
        steps=int(steps) if steps is not None else None,
        total_steps=total_steps,
        final_loss=final_loss,
        test_accuracy=_num(trainer, "testAccuracy"),
        val_loss=_num(trainer, "valLoss"),
        wall_s=wall_s,
        train_wall_s=_num(trainer, "wallS"),
        **{
            name: v if v is not None else fraction_of(records, key)
            for (key, v), name in zip(
                fractions.items(), ("comm_exposed_fraction", "comm_busy_fraction", "idle_fraction"), strict=True
            )
        },
        restarts=restarts,
        world_size=world_size,
        device=device,
        resumed_from_step=int(resumed) if resumed is not None else None,
        run_dir=str(run_dir),
        plot=str(plot) if plot else None,
        export=_export_path(trainer),
        per_stage=per_stage_of(trainer),
    )


def _export_path(trainer: dict[str, Any] | None) -> str | None:
    export = (trainer or {}).get("export")
    return str(export["path"]) if isinstance(export, dict) and "path" in export else None


def per_stage_of(trainer: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The pipeline's per-stage figures from the trainer's summary (None in other modes)."""
    stages = ((trainer or {}).get("pipeline") or {}).get("perStage")
    return [s for s in stages if isinstance(s, dict)] if isinstance(stages, list) and stages else None


def _stage_row(s: dict[str, Any]) -> str:
    def pct(key: str) -> str:
        v = _num(s, key)
        return f"{v * 100:.1f}%" if v is not None else "-"

    peak = _num(s, "activationPeakBytes")
    return (f"compute {pct('computeFraction')}, bubble {pct('bubbleFraction')}, communication "
            f"{pct('commFraction')}, idle {pct('idleFraction')}, activations peak "
            + (f"{peak / 2**20:.1f} MiB" if peak is not None else "-"))  # fmt: skip


def format_summary(s: LocalSummary) -> str:
    def opt(value: float | None, fmt: str) -> str:
        return format(value, fmt) if value is not None else "-"

    rows = [
        ("job", f"{s.job} ({s.world_size} processes on {s.device})"),
        ("status", s.status + (f": {s.reason}" if s.reason else "")),
        ("steps", f"{s.steps if s.steps is not None else '-'}/{s.total_steps}"),
    ]
    if s.test_accuracy is not None:
        rows.append(("test accuracy", f"{s.test_accuracy:.4f}"))
    if s.val_loss is not None:
        rows.append(("validation loss", f"{s.val_loss:.4f}"))
    rows += [
        ("final loss", opt(s.final_loss, ".4f")),
        (
            "wall time",
            f"{s.wall_s:.1f} s"
            + (f" (in the trainer {s.train_wall_s:.1f} s)" if s.train_wall_s else ""),
        ),
        (
            "communication",
            f"exposed {s.comm_exposed_fraction * 100:.1f}% of step time (waited for), "
            f"busy {opt((s.comm_busy_fraction or 0) * 100, '.1f')}% (in flight, overlaps compute)"
            if s.comm_exposed_fraction is not None
            else "-",
        ),
        ("idle", f"{s.idle_fraction * 100:.1f}% of step time" if s.idle_fraction is not None else "-"),
        (
            "restarts",
            str(s.restarts)
            + (f" (resumed from step {s.resumed_from_step})" if s.resumed_from_step else ""),
        ),
    ]
    rows += [(f"stage {st.get('stage', i)}", _stage_row(st)) for i, st in enumerate(s.per_stage or [])]
    rows += [
        ("run dir", s.run_dir),
    ]
    if s.plot:
        rows.append(("plot", s.plot))
    if s.export:
        rows.append(("model export", s.export))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def summary_json(s: LocalSummary) -> dict[str, Any]:
    """The saved form: camelCase keys, like the trainer's summary and the API."""
    return {camel(k): v for k, v in asdict(s).items()}


def write_summary(s: LocalSummary, run_dir: Path) -> Path:
    path = run_dir / LOCAL_SUMMARY_FILE
    path.write_text(json.dumps(summary_json(s), indent=2) + "\n")
    return path


def load_trainer_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


STAGE_KEYS = (
    ("computeFraction", "compute"),
    ("commFraction", "communication (P2P / all-reduce waits)"),
    ("bubbleFraction", "bubble (waiting for work)"),
    ("idleFraction", "idle"),
)


def write_plot(
    records: list[dict[str, Any]], path: Path, *, title: str, per_stage: list[dict[str, Any]] | None = None
) -> Path | None:
    """Loss curve and per-step compute / exposed communication / data / idle seconds (stacked; at
    most MAX_BARS bars, each the mean over consecutive records) with busy communication as a line;
    for a pipeline, a third panel with each stage's share of step time. None when nothing was logged."""
    fig = plot_figure(records, title=title, per_stage=per_stage)
    if fig is None:
        return None
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib, loaded by plot_figure already

    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def plot_figure(
    records: list[dict[str, Any]], *, title: str, per_stage: list[dict[str, Any]] | None = None
) -> Figure | None:
    """The figure write_plot saves (the caller closes it). Every legend sits below its panel,
    outside the axes: inside, wherever it went, it hid some steps' bars (the last ones, in the
    upper right) or a stage's segments."""
    records = dedupe_by_step(records)
    if not records:
        return None
    import matplotlib  # noqa: PLC0415 - matplotlib (~0.5 s), only for the plot at the end

    matplotlib.use("Agg")  # no display: a file is the only output
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib, after choosing its backend

    steps = [int(r["step"]) for r in records]
    if per_stage:
        fig, axes = plt.subplots(3, 1, figsize=(8, 12.5), gridspec_kw={"height_ratios": [3, 3, 2]})
        ax_loss, ax_time, ax_stage = axes
        ax_time.sharex(ax_loss)
    else:
        fig, (ax_loss, ax_time) = plt.subplots(2, 1, figsize=(8, 8.5), sharex=True)
    try:
        loss_pts = [(s, _num(r, "loss")) for s, r in zip(steps, records, strict=True)]
        xs = [s for s, v in loss_pts if v is not None]
        ax_loss.plot(xs, [v for _, v in loss_pts if v is not None], color="tab:blue")
        ax_loss.set_ylabel("training loss")
        ax_loss.set_title(title)
        ax_loss.grid(alpha=0.3)

        xs_time, means = binned(records, [k for k, _ in BREAKDOWN_KEYS] + [BUSY_KEY[0], "step_s"])
        bottom = [0.0] * len(xs_time)
        width = (
            max(1.0, (steps[-1] - steps[0]) / max(1, len(xs_time)) * 0.8) if len(xs_time) > 1 else 0.8
        )
        handles: list[Artist] = []  # in drawing order: the stacked categories, then the lines
        for key, label in BREAKDOWN_KEYS:
            ms = [v * 1000 for v in means[key]]
            handles.append(ax_time.bar(xs_time, ms, width=width, bottom=bottom, label=label))
            bottom = [b + v for b, v in zip(bottom, ms, strict=True)]
        busy_ms = [v * 1000 for v in means[BUSY_KEY[0]]]
        handles += ax_time.plot(xs_time, busy_ms, color="tab:red", linestyle="--", linewidth=1, label=BUSY_KEY[1])
        step_ms = [v * 1000 for v in means["step_s"]]
        handles += ax_time.plot(xs_time, step_ms, color="black", linewidth=1, label="step time")
        ax_time.set_xlabel("step")
        ax_time.set_ylabel("ms per step")
        _legend_below(ax_time, ncols=2, handles=handles)
        ax_time.grid(alpha=0.3)
        if per_stage:
            labels = [f"stage {st.get('stage', i)}" for i, st in enumerate(per_stage)]
            left = [0.0] * len(per_stage)
            for key, label in STAGE_KEYS:
                pct = [(_num(st, key) or 0.0) * 100 for st in per_stage]
                ax_stage.barh(labels, pct, left=left, label=label)
                left = [a + b for a, b in zip(left, pct, strict=True)]
            ax_stage.invert_yaxis()  # stage 0 on top
            ax_stage.set_xlabel("% of step time, per pipeline stage")
            _legend_below(ax_stage, ncols=2, handles=None)
        fig.tight_layout()  # makes room for the legends below the panels
    except BaseException:
        plt.close(fig)
        raise
    return fig


def binned(records: list[dict[str, Any]], keys: list[str], max_bars: int = MAX_BARS) -> tuple[list[float], dict[str, list[float]]]:
    """The time panel's x positions and per-step means of `keys` over at most `max_bars` runs of
    consecutive records, each record weighted by the steps it covers ("steps", 1 when absent). An
    absent or non-numeric figure counts as 0, as in a stacked bar."""
    per = max(1, -(-len(records) // max_bars))
    xs: list[float] = []
    out: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(0, len(records), per):
        group = records[i : i + per]
        weights = [max(1.0, _num(r, "steps") or 1.0) for r in group]
        total = sum(weights)
        xs.append(sum(int(r["step"]) for r in group) / len(group))
        for k in keys:
            out[k].append(sum((_num(r, k) or 0.0) * w for r, w in zip(group, weights, strict=True)) / total)
    return xs, out


def _legend_below(ax: Axes, *, ncols: int, handles: list[Artist] | None) -> None:
    """A legend centred under the axes' x label: outside the axes, it covers no data, whatever the data are.
    Placed a fixed distance below the axes (not a fraction of their height, which differs by panel)."""
    from matplotlib.transforms import ScaledTranslation  # noqa: PLC0415 - matplotlib, loaded by the caller

    handles = handles if handles is not None else ax.get_legend_handles_labels()[0]
    below_label = ScaledTranslation(0, -LEGEND_DROP_IN, ax.figure.dpi_scale_trans)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=ax.transAxes + below_label,
              ncols=ncols, fontsize="small", frameon=False)
