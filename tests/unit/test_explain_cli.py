"""`disttrain explain`: the table, the PNG, and a clear error for every input it cannot use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from disttrain_cli import main


def summary(*, world: int, compute: float = 0.010, params: int = 26122, link: bool = True) -> dict[str, Any]:
    """A data-parallel CPU run's summary as the trainer writes it (the scaling block's fields)."""
    return {
        "mode": "data", "worldSize": world, "layout": f"dp={world},pp=1,tp=1", "device": "cpu", "backend": "gloo",
        "dataStrategy": "ddp", "steps": 60,
        "scaling": {
            "perStep": {"stepS": compute + 0.002, "dataS": 0.0001, "computeS": compute, "commExposedS": 0.0019,
                        "commBusyS": 0.002, "idleS": 0.0, "steps": 50},
            "batchPerReplica": 64, "parameters": params, "parameterBytes": 4 * params, "gradientBytes": 4 * params,
            "blocks": 3, "buckets": 1, "collectives": {"all_reduce": [1, 4 * params]},
            "compression": {"kind": "none", "rank": 0, "wireBytes": 4 * params, "calls": 1},
            "lowRank": {"bytesPerRank": 2344, "uncompressedBytes": 1064},
            "activationBytes": 32768, "tensorLimit": 128,
            "tensorComm": {"count": 1, "bytes": 32768, "source": "megatron"},
            "link": {"alphaS": 5e-5, "betaBytesPerS": 1.5e9, "worldSize": world} if link and world > 1 else None,
            "host": {"cores": 2.0, "ranksOnHost": world, "threadsPerRank": 1},
        },
    }  # fmt: skip


def run_dir(tmp: Path, name: str, s: dict[str, Any] | None) -> Path:
    d = tmp / name
    d.mkdir()
    if s is not None:
        (d / "summary.json").write_text(json.dumps(s))
        (d / "metrics-rank0.jsonl").write_text("")
    return d


def test_explain_prints_the_table_and_writes_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = run_dir(tmp_path, "two", summary(world=2))
    assert main(["explain", str(d), "--target", "16", "--max-n", "64"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("N "))
    for family in ("data", "data+fp16", "data+powersgd", "fsdp", "pipeline", "tensor", "hybrid"):
        assert family in header
    rows = [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert rows == ["1", "2", "4", "8", "16", "32", "64"]
    assert "fastest:" in out and "N=16" in out
    assert "weak scaling" in out and "2 cores" in out
    assert "checked against measured runs" in out and "within 15%" in out and "3x slower" in out  # what the validation found
    png = d / "scaling-forecast.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in out


def test_a_single_rank_run_adds_its_compute_and_alone_needs_a_bandwidth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = run_dir(tmp_path, "one", summary(world=1))
    two = run_dir(tmp_path, "two", summary(world=2))
    assert main(["explain", str(one)]) == 2
    assert "--bandwidth" in capsys.readouterr().err
    assert main(["explain", str(one), "--bandwidth", "10", "--latency", "5", "--max-n", "8"]) == 0
    assert "10 GB/s, 5 us latency (given)" in capsys.readouterr().out
    assert main(["explain", str(one), str(two), "--max-n", "8"]) == 0
    assert f"forecast from {two} (world 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda t: run_dir(t, "empty", None), [], "not a disttrain run dir"),
        (lambda t: (run_dir(t, "half", None) / "metrics-rank0.jsonl").write_text("{}") and t / "half", [],
         "has not finished"),
        (lambda t: run_dir(t, "fed", {**summary(world=2), "mode": "federated"}), [], "not modelled"),
        (lambda t: run_dir(t, "old", {k: v for k, v in summary(world=2).items() if k != "scaling"}), [],
         "no 'scaling' block"),
        (lambda t: run_dir(t, "two", summary(world=2)), ["--latency", "3"], "--latency needs --bandwidth"),
        (lambda t: run_dir(t, "two", summary(world=2)), ["--bandwidth", "0"], "give a bandwidth > 0"),
        (lambda t: run_dir(t, "two", summary(world=2)), ["--target", "0"], "--target 0"),
        (lambda t: run_dir(t, "gpu", {**summary(world=2), "device": "cuda"}), ["--probe-host"],
         "did not share this host's CPU cores"),
    ],
)  # fmt: skip
def test_inputs_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, args: list[str],
                              message: str) -> None:  # fmt: skip
    d = make(tmp_path)
    assert main(["explain", str(d), *args]) == 2
    assert message in capsys.readouterr().err


def test_runs_of_different_models_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = run_dir(tmp_path, "a", summary(world=2))
    b = run_dir(tmp_path, "b", summary(world=1, params=999))
    assert main(["explain", str(a), str(b)]) == 2
    assert "different models" in capsys.readouterr().err


def test_a_job_without_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("kubernetes")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "some-job", "-n", "team"]) == 1
    assert "cannot read DistTrainJob team/some-job" in capsys.readouterr().err
