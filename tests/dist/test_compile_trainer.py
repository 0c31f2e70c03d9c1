"""training.compile and training.float8 through `python -m disttrain_trainer` (world 1, DDP).

The compile mode here is max-autotune-no-cudagraphs (test_compile.py covers default, and true is
default), in one process: its autotuning is the costliest compile.

The compiled run trains like the eager one (final and validation loss within LOSS_RTOL), reports
its compile time apart (compileS), nothing compiles again after the warm-up interval
(recompiles 0), and the steady-state throughput is reported beside the whole-run mean. float8 on a
device without float8 tensor cores (here: the CPU a GPU job falls back to) is refused at start
with exit 2, naming the device.
"""

from __future__ import annotations

from typing import Any

LOSS_RTOL = 2e-3


def _gpt_spec(**training: Any) -> dict[str, Any]:
    return {
        "mode": "data",
        "model": {"name": "gpt", "hidden": 32, "layers": 2, "heads": 2, "blockSize": 16},
        "data": {"name": "pytext", "batchSize": 8, "seed": 0},
        "optimizer": {"name": "adamw", "lr": 3e-3, "baseBatchSize": 8},
        "training": {"steps": 12, "logIntervalSteps": 4, **training},
        "checkpoint": {"intervalSteps": 12},
    }


def test_compiled_trainer_matches_eager_and_reports_compile_time_apart(trainer) -> None:  # noqa: ANN001
    eager = trainer.run(_gpt_spec(), world=1, job="eager").summary
    res = trainer.run(_gpt_spec(compile="max-autotune-no-cudagraphs"), world=1, job="compiled")
    s = res.summary
    for key in ("finalLoss", "valLoss"):
        assert abs(s[key] - eager[key]) <= LOSS_RTOL * abs(eager[key]), (key, s[key], eager[key])
    assert s["compile"] == "max-autotune-no-cudagraphs" and 0 < s["compileS"] < s["trainS"], s
    assert s["recompiles"] == 0, s
    assert "compile" not in eager and "compileS" not in eager
    # Steady state: the intervals after the first, compile time out; the whole-run mean keeps it.
    assert s["steadyTokensPerS"] > s["tokensPerS"] > 0, s
    assert s["steadySamplesPerS"] * 16 == s["steadyTokensPerS"]
    assert "peakMemoryBytesPerRank" not in s  # a GPU figure only
    assert [r["step"] for r in res.steps_log(0)] == [4, 8, 12]


def test_float8_on_a_device_without_float8_is_refused_at_start_naming_it(trainer) -> None:  # noqa: ANN001
    spec = _gpt_spec(float8=True)
    spec["workers"] = {"replicas": 1, "resources": {"gpus": 1}, "allowCPUFallback": True}
    res = trainer.run(spec, world=1, job="float8", expect_ok=False)
    assert res.returncodes == [2], res.outputs
    assert "training.float8 needs a CUDA GPU of compute capability 8.9 or newer" in res.outputs[0]
    assert "this process trains on cpu" in res.outputs[0]
