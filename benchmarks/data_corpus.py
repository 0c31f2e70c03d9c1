"""Corpus size: the example GPT on a token file of 2^31 tokens against the same run on 1 million,
2 ranks, 50 steps, vocabSize given. Per rank: peak resident memory (VmHWM, sampled every 20 ms
from /proc while the run goes) and the time from the ranks' start to the end of step 1 (the
first step line in rank 0's metrics log). The large file is sparse (a 4 GiB hole: zeros), so the
corpus costs no disk.

`--speed ROUNDS` measures instead the GPT example's throughput on the 1M-token file, SPEED_STEPS
steps (the summary's samplesPerS: the training loop's samples per second), alternating this
trainer and `--old-tree`'s ROUNDS times; the medians and their ratio.

`--old-tree DIR` runs the same with another checkout's trainer (e.g. `git worktree add DIR <rev>`
of the trainer before the data package) under an address-space limit of OLD_LIMIT_GB per rank,
so a sampler that materialises a permutation of every window fails on its own instead of taking
a shared machine's memory.

    .venv/bin/python benchmarks/data_corpus.py [--old-tree /tmp/oldtree] [--speed 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from proc_stats import peak_rss_mb

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"1M": 1_000_000, "2^31": 1 << 31}
STEPS = 50
SPEED_STEPS = 300
OLD_LIMIT_GB = 12
SPEC = {
    "mode": "data",
    "model": {"name": "gpt", "hidden": 64, "layers": 2, "heads": 4, "blockSize": 64},
    "data": {"format": "tokens", "tokenDtype": "uint16", "vocabSize": 256, "batchSize": 32},
    "optimizer": {"name": "adamw", "lr": 0.001, "scaleLR": "none", "warmupSteps": 20, "decay": "cosine"},
    "training": {"steps": STEPS, "logIntervalSteps": 1},
    "checkpoint": {"intervalSteps": 1000, "keep": 1},
}


def write_corpus(path: Path, tokens: int) -> None:
    if tokens <= 1 << 24:
        np.random.default_rng(0).integers(0, 256, tokens).astype(np.uint16).tofile(path)
    else:
        with open(path, "wb") as f:
            f.truncate(tokens * 2)  # sparse: no blocks are written


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(work: Path, name: str, corpus: Path, tree: Path | None, steps: int = STEPS) -> dict:
    spec = json.loads(json.dumps(SPEC))
    spec["data"]["path"] = str(corpus)
    spec["training"] = {"steps": steps, "logIntervalSteps": 1 if steps == STEPS else 50}
    config = work / f"{name}.json"
    config.write_text(json.dumps(spec))  # as written: each trainer fills in its own defaults
    run_dir, port = work / f"run-{name}", free_port()
    env = {**os.environ, "DISTTRAIN_CONFIG": str(config), "WORLD_SIZE": "2", "NPROC_PER_NODE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DISTTRAIN_JOB": name,
           "DISTTRAIN_CHECKPOINT_DIR": str(work / "ckpt"), "DISTTRAIN_RUN_DIR": str(run_dir),
           "DISTTRAIN_METRICS_PORT": "0", "DISTTRAIN_DATA_CACHE": str(work / f"cache-{name}"),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    if tree is not None:
        env["PYTHONPATH"] = ":".join(str(tree / p) for p in ("trainer", "operator", "cli"))

    def limit() -> None:
        if tree is not None:
            cap = OLD_LIMIT_GB << 30
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "disttrain_trainer"], cwd=ROOT, preexec_fn=limit,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "NODE_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]  # fmt: skip
    peaks, first_step = [0.0, 0.0], None
    log = run_dir / "metrics-rank0.jsonl"
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            try:
                peaks[i] = max(peaks[i], peak_rss_mb(p.pid))
            except (FileNotFoundError, ProcessLookupError):
                pass
        if first_step is None and log.exists() and any("event" not in json.loads(x) for x in log.read_text().splitlines() if x):
            first_step = time.monotonic() - t0
        time.sleep(0.02)
    outs = [p.communicate()[0] for p in procs]
    codes = [p.returncode for p in procs]
    error = ""
    if any(codes):
        lines = [x for o in outs for x in o.splitlines() if "Error" in x or "error" in x]
        error = (lines[-1] if lines else outs[0].strip().splitlines()[-1])[:160]
    summary = run_dir / "summary.json"
    rate = json.loads(summary.read_text()).get("samplesPerS") if summary.exists() and not any(codes) else None
    return {"name": name, "peak_mb": peaks, "first_step_s": first_step, "wall_s": time.monotonic() - t0,
            "exit": codes, "error": error, "samples_per_s": rate}  # fmt: skip


def speed(rounds: int, tree: Path) -> None:
    import statistics  # noqa: PLC0415 - only here

    rates: dict[str, list[float]] = {"this trainer": [], "before": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_corpus(work / "tokens.bin", SIZES["1M"])
        for i in range(rounds):
            for code, t in (("this trainer", None), ("before", tree)):
                r = run(work, f"speed-{'old' if t else 'new'}-{i}", work / "tokens.bin", t, SPEED_STEPS)
                rates[code].append(r["samples_per_s"])
                print(json.dumps({"code": code, "round": i, "samples_per_s": r["samples_per_s"]}), flush=True)
    new, old = (statistics.median(rates[k]) for k in ("this trainer", "before"))
    print(f"\nGPT example, 1M tokens, {SPEED_STEPS} steps, 2 ranks: samples/s, {rounds} alternating rounds")
    for k, v in rates.items():
        print(f"{k:<14}" + "".join(f"{x:>9.1f}" for x in v) + f"   median {statistics.median(v):.1f}")
    print(f"this / before: {new / old:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-tree", type=Path, help="also run this checkout's trainer (under an address-space limit)")
    ap.add_argument("--speed", type=int, metavar="ROUNDS", help="throughput against --old-tree instead")
    args = ap.parse_args()
    if args.speed:
        if not args.old_tree:
            ap.error("--speed needs --old-tree")
        speed(args.speed, args.old_tree)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label, tokens in SIZES.items():
            write_corpus(work / f"tokens-{label}.bin", tokens)
        trees = [("this trainer", None)] + ([("before (" + str(args.old_tree) + ")", args.old_tree)] if args.old_tree else [])
        for code, tree in trees:
            for label in SIZES:
                r = run(work, f"{'old' if tree else 'new'}-{label.replace('^', '')}", work / f"tokens-{label}.bin", tree)
                rows.append((code, label, r))
                print(json.dumps({"code": code, "tokens": label, **r}), flush=True)
    print(f"\nGPT example (hidden 64, 2 layers, block 64), batch 32, 2 ranks, {STEPS} steps, vocabSize 256")
    print(f"{'trainer':<28}{'tokens':>8}{'peak RSS rank 0/1 (MB)':>26}{'to step 1 (s)':>15}{'exit':>10}")
    for code, label, r in rows:
        first = f"{r['first_step_s']:.1f}" if r["first_step_s"] is not None else "-"
        peaks = "/".join(f"{p:.0f}" for p in r["peak_mb"])
        print(f"{code[:27]:<28}{label:>8}{peaks:>26}{first:>15}{str(r['exit']):>10}  {r['error']}")


if __name__ == "__main__":
    main()
