"""The final summary of a local run and its PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from disttrain_trainer.launcher import report


def _records() -> list[dict[str, float | str]]:
    # Steps 10..40, then a resumed attempt re-logs 30 and 40 with other figures.
    recs = [
        {
            "step": s,
            "loss": 1.0 / s,
            "step_s": 0.1,
            "compute_s": 0.06,
            "comm_exposed_s": 0.03,
            "comm_busy_s": 0.05,
            "idle_s": 0.0,
            "data_s": 0.01,
        }
        for s in (10, 20, 30, 40)
    ]
    recs += [
        {"step": 30, "loss": 0.5, "step_s": 0.2, "comm_exposed_s": 0.1},
        {"step": 40, "loss": 0.25, "step_s": 0.2, "comm_exposed_s": 0.1, "idle_s": 0.02},
        {"event": "checkpoint", "step": 40, "checkpoint_s": 0.5},  # not a step record
    ]
    return recs


def test_dedupe_keeps_the_latest_record_per_step() -> None:
    d = report.dedupe_by_step(_records())
    assert [r["step"] for r in d] == [10, 20, 30, 40]
    assert d[2]["loss"] == 0.5 and d[3]["loss"] == 0.25


def test_a_fraction_no_record_holds_is_unknown_not_zero() -> None:
    # A private federated run releases each round's wall time but not its split.
    records = [{"step": 1, "step_s": 0.5, "test_accuracy": 0.3}, {"step": 2, "step_s": 0.4}]
    assert report.fraction_of(records, "comm_exposed_s") is None
    assert report.fraction_of(report.dedupe_by_step(_records()), "idle_s") == pytest.approx(0.02 / 0.6)


def test_summary_prefers_the_trainer_figures_and_adds_restarts(tmp_path: Path) -> None:
    trainer = {
        "steps": 40,
        "finalLoss": 0.25,
        "testAccuracy": 0.9712,
        "wallS": 12.5,
        "commExposedFraction": 0.31,
        "commBusyFraction": 0.5,
        "idleFraction": 0.02,
        "export": {"path": "/ckpt/demo/export", "weights": "model.safetensors", "step": 40},
    }
    s = report.build_summary(
        job="demo",
        status="Succeeded",
        reason=None,
        trainer=trainer,
        records=report.dedupe_by_step(_records()),
        total_steps=40,
        wall_s=20.0,
        restarts=1,
        world_size=2,
        device="cpu",
        run_dir=tmp_path,
        plot=None,
    )
    assert (s.steps, s.test_accuracy, s.comm_exposed_fraction, s.restarts) == (40, 0.9712, 0.31, 1)
    assert (s.comm_busy_fraction, s.idle_fraction) == (0.5, 0.02)
    text = report.format_summary(s)
    assert "test accuracy  0.9712" in text and "model export   /ckpt/demo/export" in text
    assert "exposed 31.0% of step time" in text and "busy 50.0%" in text and "restarts" in text and "40/40" in text
    saved = json.loads(report.write_summary(s, tmp_path).read_text())
    assert saved["restarts"] == 1 and saved["testAccuracy"] == 0.9712
    assert saved["totalSteps"] == 40 and saved["trainWallS"] == 12.5 and saved["commExposedFraction"] == 0.31
    assert all("_" not in key for key in saved), sorted(saved)


def test_summary_without_trainer_summary_falls_back_to_the_log(tmp_path: Path) -> None:
    recs = report.dedupe_by_step(_records())
    s = report.build_summary(
        job="demo",
        status="Failed",
        reason="BackoffLimitExceeded",
        trainer=None,
        records=recs,
        total_steps=100,
        wall_s=5.0,
        restarts=3,
        world_size=2,
        device="cpu",
        run_dir=tmp_path,
        plot=None,
    )
    assert s.steps == 40 and s.final_loss == 0.25 and s.test_accuracy is None
    # exposed comm / step over the logged steps: (0.03 + 0.03 + 0.1 + 0.1) / (0.1 + 0.1 + 0.2 + 0.2)
    assert abs((s.comm_exposed_fraction or 0) - 0.26 / 0.6) < 1e-9
    assert abs((s.idle_fraction or 0) - 0.02 / 0.6) < 1e-9
    assert "Failed: BackoffLimitExceeded" in report.format_summary(s)


def test_plot_is_a_png(tmp_path: Path) -> None:
    path = report.write_plot(_records(), tmp_path / "training.png", title="demo")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.write_plot([], tmp_path / "none.png", title="x") is None


def test_resuming_a_finished_run_reports_the_finished_runs_figures(tmp_path: Path) -> None:
    # The trainer returns the summary stored with the final checkpoint: the figures of
    # the training that happened, not of the resumed attempt that had nothing to do.
    recs = report.dedupe_by_step(_records())
    trainer = {"steps": 40, "finalLoss": 0.3, "commExposedFraction": 0.2, "resumedFromStep": None,
               "testAccuracy": 0.96, "wallS": 9.0}  # fmt: skip
    s = report.build_summary(
        job="demo", status="Succeeded", reason=None, trainer=trainer, records=recs,
        total_steps=40, wall_s=5.0, restarts=0, world_size=2, device="cpu", run_dir=tmp_path, plot=None,
    )  # fmt: skip
    assert (s.final_loss, s.comm_exposed_fraction, s.test_accuracy, s.train_wall_s) == (0.3, 0.2, 0.96, 9.0)


def test_a_nan_loss_from_the_trainer_falls_back_to_the_log(tmp_path: Path) -> None:
    recs = report.dedupe_by_step(_records())
    trainer = {"steps": 40, "finalLoss": float("nan")}
    s = report.build_summary(
        job="demo", status="Succeeded", reason=None, trainer=trainer, records=recs,
        total_steps=40, wall_s=5.0, restarts=0, world_size=2, device="cpu", run_dir=tmp_path, plot=None,
    )  # fmt: skip
    assert s.final_loss == 0.25 and abs((s.comm_exposed_fraction or 0) - 0.26 / 0.6) < 1e-9


PER_STAGE = [
    {"stage": 0, "computeFraction": 0.6, "bubbleFraction": 0.25, "commFraction": 0.1, "idleFraction": 0.0,
     "activationPeakBytes": 3 * 2**20},
    {"stage": 1, "computeFraction": 0.5, "bubbleFraction": 0.35, "commFraction": 0.12, "idleFraction": 0.01,
     "activationPeakBytes": 2**20},
]  # fmt: skip


def test_a_pipeline_summary_and_plot_show_every_stage(tmp_path: Path) -> None:
    trainer = {"steps": 40, "finalLoss": 0.3, "pipeline": {"schedule": "1F1B", "stages": 2, "perStage": PER_STAGE}}
    s = report.build_summary(job="pp", status="Succeeded", reason=None, trainer=trainer,
                             records=report.dedupe_by_step(_records()), total_steps=40, wall_s=5.0, restarts=0,
                             world_size=2, device="cpu", run_dir=tmp_path, plot=None)  # fmt: skip
    assert s.per_stage == PER_STAGE
    lines = report.format_summary(s).splitlines()
    stage1 = next(line for line in lines if line.strip().startswith("stage 1"))
    assert "bubble 35.0%" in stage1 and "compute 50.0%" in stage1 and "activations peak 1.0 MiB" in stage1
    assert json.loads(report.write_summary(s, tmp_path).read_text())["perStage"][0]["bubbleFraction"] == 0.25
    # Other modes: no stage rows.
    plain = report.build_summary(job="d", status="Succeeded", reason=None, trainer={"steps": 40}, records=[],
                                 total_steps=40, wall_s=1.0, restarts=0, world_size=2, device="cpu",
                                 run_dir=tmp_path, plot=None)  # fmt: skip
    assert plain.per_stage is None and "stage" not in report.format_summary(plain)
    with_stages = report.write_plot(_records(), tmp_path / "pp.png", title="pp", per_stage=PER_STAGE)
    without = report.write_plot(_records(), tmp_path / "d.png", title="pp")
    assert with_stages is not None and without is not None
    # The stage panel makes a taller figure (12.5 in vs 8.5 in at 100 dpi).
    assert _png_height(with_stages) == 1250 and _png_height(without) == 850


def _png_height(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[20:24], "big")  # IHDR: width at 16..20, height at 20..24


def _demo_records() -> list[dict[str, float]]:
    """A `make demo`-like log: 40 intervals whose stacked bars reach the top of the panel at both ends."""
    return [{"step": s, "steps": 10, "loss": 2.3 * 0.99**s, "step_s": 0.0098, "compute_s": 0.005,
             "comm_exposed_s": 0.004, "comm_busy_s": 0.006, "data_s": 0.0005, "idle_s": 0.0003 if s % 100 == 0 else 0.0}
            for s in range(10, 410, 10)]  # fmt: skip


@pytest.mark.parametrize("per_stage", [None, PER_STAGE], ids=["data", "pipeline"])
def test_no_legend_hides_data(per_stage: list[dict[str, float]] | None) -> None:
    """Geometry of the rendered figure (Agg): each legend lies inside the figure and outside every
    panel's data region, so it covers none of the bars or lines (the time breakdown's last
    intervals, a stage's segments), nor a panel's tick or axis labels."""
    fig = report.plot_figure(_demo_records(), title="demo", per_stage=per_stage)
    assert fig is not None
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert len(legends) == (2 if per_stage else 1)
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, (
                f"legend {box} reaches outside the figure {fig.bbox}")
            for ax in fig.axes:
                assert not box.overlaps(ax.bbox), f"legend {box} overlaps the data region {ax.bbox}"
                data = [*ax.patches, *ax.lines]
                assert data, "every panel draws something"
                for artist in data:
                    assert not box.overlaps(artist.get_window_extent(renderer)), f"legend covers {artist}"
                labels = [ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()]
                for text in labels:
                    if text.get_visible() and text.get_text():
                        assert not box.overlaps(text.get_window_extent(renderer)), f"legend covers {text}"
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_a_long_run_is_drawn_as_means_over_at_most_max_bars() -> None:
    """A run logging every step for 10 minutes (40 000 records) took matplotlib minutes and 1.5 GB
    with a bar per record; the panel draws means over runs of consecutive records instead."""
    n = 40_000
    records = [{"step": s, "steps": 1, "loss": 1.0, "step_s": 0.002 if s % 2 else 0.004,
                "compute_s": 0.001 if s % 2 else 0.003, "comm_exposed_s": 0.001} for s in range(1, n + 1)]  # fmt: skip
    fig = report.plot_figure(records, title="long", per_stage=None)
    assert fig is not None
    try:
        ax_time = fig.axes[1]
        bars = [p for c in ax_time.containers for p in c]
        assert len(bars) <= len(report.BREAKDOWN_KEYS) * report.MAX_BARS
        heights = [p.get_height() for p in ax_time.containers[0]]  # compute: the mean of 1 ms and 3 ms
        assert min(heights) == pytest.approx(2.0) and max(heights) == pytest.approx(2.0)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_bins_weigh_each_record_by_the_steps_it_covers() -> None:
    records = [{"step": 10, "steps": 10, "compute_s": 0.001}, {"step": 11, "steps": 1, "compute_s": 0.012},
               {"step": 20}]  # fmt: skip
    xs, means = report.binned(records, ["compute_s"], max_bars=1)
    assert xs == [pytest.approx(41 / 3)]
    assert means["compute_s"] == [pytest.approx((0.01 + 0.012 + 0.0) / 12)]
    xs, means = report.binned(records, ["compute_s"], max_bars=10)  # fewer records than bars: one each
    assert xs == [10, 11, 20] and means["compute_s"] == [0.001, 0.012, 0.0]
