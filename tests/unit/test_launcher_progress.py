"""Progress line formatting and tailing a JSON-lines file that is still being written."""

from __future__ import annotations

import io
import json
from pathlib import Path

from disttrain_api.model import parse_spec
from disttrain_trainer.launcher.progress import (
    JsonlTail,
    ProgressPrinter,
    ProgressRecord,
    format_progress,
)


def test_format_progress_line() -> None:
    line = format_progress(
        step=120, total=500, loss=0.43214, samples_per_s=1234.5, elapsed_s=75, restarts=1
    )
    assert line.startswith("[######------------------]")
    assert "step 120/500" in line and " 24%" in line
    assert "loss 0.4321" in line and "1,234 samples/s" in line
    assert "restarts 1" in line and line.endswith("1:15")


def test_format_progress_without_figures_and_bar() -> None:
    line = format_progress(
        step=0, total=10, loss=None, samples_per_s=None, elapsed_s=3700, bar=False
    )
    assert line == "step 0/10    0%  loss -  - samples/s  1:01:40"


def test_tail_reads_only_complete_lines_and_survives_truncation(tmp_path: Path) -> None:
    path = tmp_path / "metrics-rank0.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []  # not there yet
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "lo')
    assert tail.read_new() == [{"step": 1}]
    with path.open("a") as f:
        f.write('ss": 0.5}\nnot json\n')
    assert tail.read_new() == [{"step": 2, "loss": 0.5}]
    path.write_text(json.dumps({"step": 3}) + "\n")  # a new attempt rewrote the file
    assert tail.read_new() == [{"step": 3}]


def test_plain_output_is_throttled_but_keeps_the_last_state() -> None:
    now = [0.0]
    out = io.StringIO()
    p = ProgressPrinter(out, total=100, tty=False, plain_interval_s=2.0, clock=lambda: now[0])
    p.update({"step": 10, "loss": 1.0, "samples_per_s": 10}, elapsed_s=1, restarts=0)
    now[0] = 1.0
    p.update({"step": 20, "loss": 0.9, "samples_per_s": 10}, elapsed_s=2, restarts=0)  # throttled
    p.note("restarting")
    p.status("not shown without a terminal")
    p.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "step 10/100" in lines[0] and lines[1] == "restarting" and "step 20/100" in lines[2]
    assert "\r" not in out.getvalue()


def test_tty_output_redraws_in_place() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out, total=10, tty=True)
    p.status("starting 2 processes ... 3 s")
    p.update({"step": 5, "loss": 1.0}, elapsed_s=1, restarts=0)
    p.update({"step": 10, "loss": 0.5}, elapsed_s=2, restarts=0)
    p.finish()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "[" in text and "starting" in text


def test_the_run_dir_keeps_what_status_progress_would_say(tmp_path: Path) -> None:
    """Rank 0's records through the operator's arithmetic; progress.json rewritten at most every 10 s."""
    spec = parse_spec({"mode": "data", "workers": {"replicas": 2}, "data": {"batchSize": 64}, "training": {"steps": 100}})
    clock = [0.0]
    rec = ProgressRecord(spec, tmp_path / "progress.json", clock=lambda: clock[0])
    t0 = 1_767_268_800.0  # 2026-01-01T12:00:00Z
    first = rec.update({"step": 10, "loss": 1.0, "samples_per_s": 50.0, "time": t0})
    assert first is not None and "eta" not in first  # one record: no rate yet
    assert json.loads((tmp_path / "progress.json").read_text())["completed"] == 10
    clock[0] = 5.0
    block = rec.update({"step": 30, "time": t0 + 10.0})
    assert block is not None and block["rate"] == 2.0 and block["samplesPerSecond"] == 128.0
    assert block["eta"] == "35s" and block["percent"] == 30.0
    assert json.loads((tmp_path / "progress.json").read_text())["completed"] == 10  # within 10 s: not rewritten
    out = io.StringIO()
    printer = ProgressPrinter(out, total=100, tty=False)
    printer.update({"step": 30, "loss": 0.5, "samples_per_s": 64.0}, elapsed_s=12, restarts=0, progress=block)
    assert "128 samples/s" in out.getvalue() and "ETA 35s" in out.getvalue()  # the job's, not rank 0's 64
    done = rec.finish(succeeded=True, result={"samplesPerS": 120.0})
    saved = json.loads((tmp_path / "progress.json").read_text())
    assert done == saved and saved["percent"] == 100.0 and saved["eta"] == "0s" and saved["samplesPerSecond"] == 120.0


def test_the_eta_adds_rank0s_finish_estimate_and_a_new_gang_re_anchors_the_window(tmp_path: Path) -> None:
    spec = parse_spec({"mode": "data", "data": {"batchSize": 64}, "training": {"steps": 100}})
    rec = ProgressRecord(spec, tmp_path / "progress.json", interval_s=0.0)
    t0 = 1_767_268_800.0
    rec.update({"step": 10, "time": t0, "finish_s": 12.0})
    block = rec.update({"step": 30, "time": t0 + 10.0, "finish_s": 12.0})
    assert block is not None and block["etaSeconds"] == 70 / 2 + 12  # steps left at 2/s, then the run's end
    rec.restarted()  # the gang restarts: its first record, 60 s later, is no slow window
    block = rec.update({"step": 20, "time": t0 + 70.0, "finish_s": 12.0})
    assert block is not None and block["rate"] == 2.0 and block["etaSeconds"] == 80 / 2 + 12
    assert json.loads((tmp_path / "progress.json").read_text())["completed"] == 20  # interval 0: every update
