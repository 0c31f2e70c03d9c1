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
    assert main(["explain", str(d), "--target", "16", "--max-n", "64", "--own-cores"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("N "))
    for family in ("data", "data+fp16", "data+powersgd", "fsdp", "pipeline", "tensor", "hybrid"):
        assert family in header
    rows = [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert rows == ["1", "2", "4", "8", "16", "32", "64"]
    assert "fastest:" in out and "N=16" in out
    assert "weak scaling" in out
    assert "checked against measured runs" in out and "within 15%" in out and "3x slower" in out  # what the validation found
    png = d / "scaling-forecast.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in out
    # On the run's own 2 cores (the default for a local run) N = 4 and beyond oversubscribe them: not forecast.
    assert main(["explain", str(d), "--max-n", "64"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert rows == ["1", "2"] and "fastest: " in out and "N=2" in out and "2 cores" in out
    assert ("not forecast: N=4, 8, 16, 32, 64: from N=4, 4 ranks x 1 thread(s) on 2 cores: more runnable threads than "
            "cores") in out  # fmt: skip
    assert main(["explain", str(d), "--max-n", "64", "--target", "8"]) == 2
    assert "N=8 is not forecast: 8 ranks x 1 thread(s) on 2 cores" in capsys.readouterr().err


def test_a_run_whose_ranks_oversubscribed_its_cores_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = summary(world=4)
    d = run_dir(tmp_path, "four", s)
    assert main(["explain", str(d)]) == 2
    err = capsys.readouterr().err
    assert "the run itself had 4 ranks x 1 thread(s) on 2 cores" in err and "OMP_NUM_THREADS=1" in err


def test_one_rank_per_pod_under_a_fractional_cpu_quota_is_forecast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A 250m worker pod: its one single-threaded rank is throttled, not contended; two ranks there are.
    s = summary(world=2)
    s["scaling"]["host"] = {"cores": 0.25, "ranksOnHost": 1, "threadsPerRank": 1}
    assert main(["explain", str(run_dir(tmp_path, "quota", s)), "--max-n", "8"]) == 0, capsys.readouterr().err
    assert "fastest: " in capsys.readouterr().out
    s["scaling"]["host"] = {"cores": 0.5, "ranksOnHost": 2, "threadsPerRank": 1}
    assert main(["explain", str(run_dir(tmp_path, "shared", s)), "--max-n", "8"]) == 2
    assert "the run itself had 2 ranks x 1 thread(s) on 0.5 cores" in capsys.readouterr().err


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


def test_the_forecast_prints_its_uncertainty_from_the_link_probes_spread(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    s = summary(world=2)
    link = s["scaling"]["link"]
    # The probe's quartiles: a link 30% faster and 30% slower than its median.
    link["fast"] = {"alphaS": link["alphaS"] / 1.3, "betaBytesPerS": link["betaBytesPerS"] * 1.3}
    link["slow"] = {"alphaS": link["alphaS"] * 1.3, "betaBytesPerS": link["betaBytesPerS"] / 1.3}
    d = run_dir(tmp_path, "noisy", s)
    assert main(["explain", str(d), "--own-cores", "--max-n", "64", "--target", "64"]) == 0
    out = capsys.readouterr().out
    fastest = next(line for line in out.splitlines() if line.startswith("fastest: "))
    assert "(range " in fastest and "±" in fastest
    row = next(line for line in out.splitlines() if line.lstrip().startswith("64 "))
    assert "±" in row
    # Without the probe's range (an older trainer's summary) nothing is claimed.
    del link["fast"], link["slow"]
    d2 = run_dir(tmp_path, "plain", s)
    assert main(["explain", str(d2), "--own-cores", "--max-n", "64"]) == 0
    assert "±" not in capsys.readouterr().out


def test_layouts_whose_ranges_overlap_are_called_noise() -> None:
    from disttrain_api.scaling import best_at, forecast, measured_from_summary

    s = summary(world=2)
    link = s["scaling"]["link"]
    link["fast"] = {"alphaS": link["alphaS"] / 1.05, "betaBytesPerS": link["betaBytesPerS"] * 1.05}
    link["slow"] = {"alphaS": link["alphaS"] * 1.05, "betaBytesPerS": link["betaBytesPerS"] / 1.05}
    fc = forecast(measured_from_summary(s, source="noisy"), own_cores=True, sizes=(1, 2, 64))
    fp16, plain, fsdp = fc.at(64)[:3]
    assert (fp16.family, plain.family, fsdp.family) == ("data+fp16", "data", "fsdp")
    # fp16 compression saves 0.4% at N=64, less than the probe's ±2%: noise; FSDP's 29% is not.
    assert 0.01 < fc.uncertainty(fp16) < 0.05 and not fc.distinct(fp16, plain) and fc.distinct(plain, fsdp)
    assert "within the link probe's noise, not a real difference" in best_at(fc, 64).reason
