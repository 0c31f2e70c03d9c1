"""The summary's forecast inputs from real gloo ranks, and `disttrain explain` on the run dirs."""

from __future__ import annotations

import json

from disttrain_cli import main

STEPS, LOG = 20, 5


def test_data_parallel_powersgd_records_its_wire_bytes_and_explains(trainer, make_digits_spec, capsys) -> None:  # noqa: ANN001
    spec = make_digits_spec(workers={"replicas": 2}, training={"steps": STEPS, "logIntervalSteps": LOG,
                                                               "gradientCompression": "powersgd", "powerSGDRank": 2})  # fmt: skip
    res = trainer.run(spec, world=2, job="psgd")
    sc = res.summary["scaling"]
    assert sc["perStep"]["steps"] == STEPS - LOG  # the first log interval (warm-up) left out
    assert sc["link"]["worldSize"] == 2 and sc["link"]["betaBytesPerS"] > 0 and sc["link"]["alphaS"] >= 0
    # the probe's quartiles fitted too: the range its median lies in (the forecast's uncertainty)
    assert sc["link"]["fast"]["betaBytesPerS"] > 0 and sc["link"]["slow"]["betaBytesPerS"] > 0
    assert sc["buckets"] == 1 and sc["host"]["ranksOnHost"] == 2 and sc["host"]["threadsPerRank"] == 1
    comp = sc["compression"]
    # what the hook sent (its own counter, every bucket and factor) = PowerSGD's payload from the shapes
    low = sc["lowRank"]
    assert comp["wireBytes"] == 2 * low["bytesPerRank"] + low["uncompressedBytes"] < sc["gradientBytes"]
    assert comp["calls"] == 3 and comp["blocksBackward"] is True
    # the pod's termination message (status.result) carries the same block
    message = json.loads((trainer.tmp / "termination-psgd-0.log").read_text())
    assert message["scaling"]["compression"] == comp
    # 8 ranks on this host's 2 cores are not forecast; with cores of their own they are, with a range
    assert main(["explain", str(res.run_dir), "--max-n", "16", "--target", "8"]) == 2
    assert "N=8 is not forecast: 8 ranks x 1 thread(s) on 2 cores" in capsys.readouterr().err
    assert main(["explain", str(res.run_dir), "--max-n", "16", "--target", "8", "--own-cores"]) == 0
    out = capsys.readouterr().out
    assert "fastest:" in out and "measured wire bytes" in out and "(range " in out
    assert (res.run_dir / "scaling-forecast.png").is_file()
    # this host's ring measured with 4 local ranks (no training) replaces the extrapolated one at N = 4
    assert main(["explain", str(res.run_dir), "--max-n", "4", "--probe-host"]) == 0
    assert "links measured on this host at N=4 ranks" in capsys.readouterr().out


def test_pipeline_records_blocks_stages_and_boundaries(trainer, make_digits_spec) -> None:  # noqa: ANN001
    spec = make_digits_spec(mode="pipeline", workers={"replicas": 2}, model={"name": "mlp", "hidden": 32, "layers": 4},
                            parallelism={"pipeline": 2, "microbatches": 4, "schedule": "1F1B", "partition": "profile"},
                            training={"steps": STEPS, "logIntervalSteps": LOG})  # fmt: skip
    sc = trainer.run(spec, world=2, job="pipe").summary["scaling"]
    pipe = sc["pipeline"]
    assert sc["blocks"] == len(pipe["blockSeconds"]) == len(pipe["blockOutBytes"]) == 5  # stem, 3 blocks, head
    assert len(pipe["stageComputeS"]) == 2 and min(pipe["stageComputeS"]) > 0
    # a micro-batch of 64 / 4 rows crosses the one boundary as 16 x 32 fp32 activations
    assert pipe["boundaryBytes"] == [16 * 32 * 4]


def test_tensor_parallel_records_its_measured_collectives(trainer, make_digits_spec) -> None:  # noqa: ANN001
    spec = make_digits_spec(mode="tensor", workers={"replicas": 1, "procsPerWorker": 2}, parallelism={"tensor": 2},
                            model={"name": "mlp", "hidden": 32, "layers": 3},
                            training={"steps": STEPS, "logIntervalSteps": LOG})  # fmt: skip
    sc = trainer.run(spec, world=2, job="tp").summary["scaling"]
    tc = sc["tensorComm"]
    assert tc["source"] == "measured" and tc["count"] >= 1 and tc["bytes"] > 0
    assert sc["collectives"]["all_reduce"][0] >= 1
