"""The data fraction of the GPT example's step: your own memory-mapped token file (format tokens)
against the built-in pytext shards, the same corpus and model, side by side in one run.

Both read CPython's help text as character ids (pytext's vocabulary): pytext from its packed .npy
shards, tokens from a nanoGPT-style train.bin/val.bin written here. Each is run with `disttrain
local` (2 processes, CPU/gloo) ROUNDS times, alternately, so machine load hits both alike; the
table prints the median data fraction (data-loading seconds / step seconds, the summary's
dataFraction) and throughput. Then the read alone: microseconds per rank batch (16 windows)
through Dataset.batch, alternately, READ_REPEATS times each.

    .venv/bin/python benchmarks/data_tokens.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
VAL_FRACTION = 0.1  # as pytext's split
READ_BATCHES = 2000
READ_REPEATS = 3

JOB = {
    "apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "bench"},
    "spec": {
        "mode": "data", "workers": {"replicas": 2},
        "model": {"name": "gpt", "hidden": 64, "layers": 2, "heads": 4, "blockSize": 64},
        "optimizer": {"name": "adamw", "lr": 0.001, "scaleLR": "none", "decay": "none"},
        "training": {"steps": 150, "logIntervalSteps": 50},
        "checkpoint": {"intervalSteps": 1000},
    },
}  # fmt: skip


def write_corpus(folder: Path) -> None:
    from disttrain_trainer.datasets import corpus_text, vocabulary  # noqa: PLC0415 - the trainer package

    index = {c: i for i, c in enumerate(vocabulary())}
    ids = np.fromiter((index[c] for c in corpus_text()), dtype=np.uint16)
    split = int(len(ids) * (1 - VAL_FRACTION))
    folder.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")


def run(work: Path, name: str, data: dict) -> dict:
    job = json.loads(json.dumps(JOB))
    job["spec"]["data"] = {**data, "batchSize": 32}
    manifest = work / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(job))
    run_dir = work / f"run-{name}"
    cmd = [sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir", str(run_dir), "--fresh",
           "--no-progress", "--metrics-port", "0"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(work))
    if p.returncode:
        raise SystemExit(f"{name}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def _env(work: Path) -> dict[str, str]:
    import os  # noqa: PLC0415 - only here

    return {**os.environ, "DISTTRAIN_DATA_CACHE": str(work / "cache")}


def read_us(work: Path) -> dict[str, float]:
    """Median microseconds of one rank's batch read (16 windows) from each source, alternately."""
    import time  # noqa: PLC0415 - only here

    from disttrain_api.model import parse_spec  # noqa: PLC0415 - the API package
    from disttrain_trainer.datasets import load_dataset  # noqa: PLC0415 - the trainer package

    model = JOB["spec"]["model"]
    sets = {"pytext": load_dataset(parse_spec({"model": model, "data": {"name": "pytext"}}), work / "cache"),
            "tokens (mmap)": load_dataset(parse_spec({"model": model, "data": {
                "path": str(work / "corpus"), "format": "tokens"}}), work / "cache")}  # fmt: skip
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in sets}
    for _ in range(READ_REPEATS):
        for name, ds in sets.items():
            rows = [rng.integers(0, ds.num_train, 16) for _ in range(READ_BATCHES)]
            t = time.perf_counter()
            for r in rows:
                ds.batch(r)
            times[name].append((time.perf_counter() - t) / READ_BATCHES * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_corpus(work / "corpus")
        sources = {"pytext": {"name": "pytext"},
                   "tokens (mmap)": {"path": "corpus", "format": "tokens"}}  # fmt: skip
        results: dict[str, list[dict]] = {k: [] for k in sources}
        for _ in range(ROUNDS):
            for name, data in sources.items():
                results[name].append(run(work, name.split()[0], data))
        print(f"GPT (hidden 64, 2 layers, block 64), batch 32, 2 processes, {ROUNDS} runs each, medians")
        reads = read_us(work)
        print(f"{'data':<16}{'dataFraction':>14}{'samples/s':>11}{'read us/batch':>15}")
        for name, rs in results.items():
            frac = statistics.median(r["dataFraction"] for r in rs)
            rate = statistics.median(r["samplesPerS"] for r in rs)
            print(f"{name:<16}{frac:>14.4f}{rate:>11.1f}{reads[name]:>15.1f}")


if __name__ == "__main__":
    main()
