"""The data fraction of the GPT example's step: your own memory-mapped token file (format tokens)
and the same file on an S3-compatible server (s3://, windows read by ranged GETs with prefetch)
against the built-in pytext shards, the same corpus and model, side by side in one run.

Both read CPython's help text as character ids (pytext's vocabulary): pytext from its packed .npy
shards, tokens from a nanoGPT-style train.bin/val.bin written here. Each is run with `disttrain
local` (2 processes, CPU/gloo) ROUNDS times, alternately, so machine load hits both alike; the
table prints the median data fraction (data-loading seconds / step seconds, the summary's
dataFraction) and throughput. Then the read alone: microseconds per rank batch (16 windows)
through Dataset.batch, alternately, READ_REPEATS times each (from S3: S3_READ_BATCHES, each
read when asked, without prefetch: the latency the loop would see without it).

The S3 server is moto in server mode (the dev extra's moto[server]) on a loopback port, started
here; its latency is a local server's, not a remote bucket's.

    .venv/bin/python benchmarks/data_tokens.py
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import yaml
from proc_stats import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
VAL_FRACTION = 0.1  # as pytext's split
READ_BATCHES = 2000
S3_READ_BATCHES = 100
READ_REPEATS = 3
BUCKET = "bench"

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
    from disttrain_trainer.data import corpus_text, vocabulary  # noqa: PLC0415 - the trainer package

    index = {c: i for i, c in enumerate(vocabulary())}
    ids = np.fromiter((index[c] for c in corpus_text()), dtype=np.uint16)
    split = int(len(ids) * (1 - VAL_FRACTION))
    folder.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")


@contextlib.contextmanager
def s3_server(work: Path) -> Iterator[tuple[str, int]]:
    """moto's S3 server on a free loopback port with the corpus uploaded to s3://bench/corpus/."""
    import boto3  # noqa: PLC0415 - the dev extra

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", url.rsplit(":", 1)[1]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.05)
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", **_CREDENTIALS_KW)
        client.create_bucket(Bucket=BUCKET)
        for f in ("train.bin", "val.bin"):
            client.upload_file(str(work / "corpus" / f), BUCKET, f"corpus/{f}")
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# moto (without IAM auth) takes any key; the trainer's AWS credential chain needs one to sign with.
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
_CREDENTIALS_KW = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


def run(work: Path, name: str, data: dict, extra: dict | None = None) -> dict:
    job = json.loads(json.dumps(JOB))
    job["spec"]["data"] = {**data, "batchSize": 32}
    job["spec"].update(extra or {})
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
    return {**os.environ, **_CREDENTIALS, "DISTTRAIN_DATA_CACHE": str(work / "cache")}


def read_us(work: Path, url: str) -> dict[str, float]:
    """Median microseconds of one rank's batch read (16 windows) from each source, alternately."""
    from disttrain_api.model import parse_spec  # noqa: PLC0415 - the API package
    from disttrain_trainer.data import load_dataset  # noqa: PLC0415 - the trainer package

    os.environ.update(_CREDENTIALS)
    model = JOB["spec"]["model"]
    sets = {"pytext": load_dataset(parse_spec({"model": model, "data": {"name": "pytext"}}), work / "cache"),
            "tokens (mmap)": load_dataset(parse_spec({"model": model, "data": {
                "path": str(work / "corpus"), "format": "tokens"}}), work / "cache"),
            "tokens (s3)": load_dataset(parse_spec({"model": model, "objectStore": {"endpoint": url}, "data": {
                "path": f"s3://{BUCKET}/corpus", "format": "tokens"}}), work / "cache")}  # fmt: skip
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in sets}
    for _ in range(READ_REPEATS):
        for name, ds in sets.items():
            n = S3_READ_BATCHES if "s3" in name else READ_BATCHES
            rows = [rng.integers(0, ds.num_train, 16) for _ in range(n)]
            t = time.perf_counter()
            for r in rows:
                ds.batch(r)
            times[name].append((time.perf_counter() - t) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_corpus(work / "corpus")
        with s3_server(work) as (url, server_pid):
            sources = {"pytext": ({"name": "pytext"}, None),
                       "tokens (mmap)": ({"path": "corpus", "format": "tokens"}, None),
                       "tokens (s3)": ({"path": f"s3://{BUCKET}/corpus", "format": "tokens"},
                                       {"objectStore": {"endpoint": url}})}  # fmt: skip
            results: dict[str, list[dict]] = {k: [] for k in sources}
            server_cpu: list[float] = []  # the local server shares the machine's cores with the run
            for _ in range(ROUNDS):
                for name, (data, extra) in sources.items():
                    before = cpu_seconds(server_pid)
                    results[name].append(run(work, name.replace(" (", "-").rstrip(")"), data, extra))
                    if extra:
                        server_cpu.append(cpu_seconds(server_pid) - before)
            print(f"GPT (hidden 64, 2 layers, block 64), batch 32, 2 processes, {ROUNDS} runs each, medians")
            reads = read_us(work, url)
        print(f"{'data':<16}{'dataFraction':>14}{'samples/s':>11}{'read us/batch':>15}")
        for name, rs in results.items():
            frac = statistics.median(r["dataFraction"] for r in rs)
            rate = statistics.median(r["samplesPerS"] for r in rs)
            print(f"{name:<16}{frac:>14.4f}{rate:>11.1f}{reads[name]:>15.1f}")
        wall = statistics.median(r["wallS"] for r in results["tokens (s3)"])
        print(f"S3 server CPU per s3 run: {statistics.median(server_cpu):.1f} s (run wall {wall:.1f} s)")


if __name__ == "__main__":
    main()
