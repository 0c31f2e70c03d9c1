"""Gradient compression on a communication-bound step: none vs fp16 vs PowerSGD, 2 gloo processes.

A wide MLP with a small batch makes the step communication-bound here: tens of MB
of gradients per step against a few ms of compute per rank. The trainer itself
runs each setting (`modes/data/entry.run`, `training.gradientCompression` = none | fp16 |
powersgd), metrics on, one JSON-lines record per step; the settings alternate
round by round so load drift hits all alike. Printed per setting: median step
time, exposed and busy communication per step (DDP's reducer timer), compute,
and the step-time ratio to no compression.

On loopback the "network" is a memcpy by the same two cores that compute, so fewer
bytes barely pay for the cast or the low-rank factorisation. `--link-mbit N` runs
each rank in its own network namespace, the two joined by a veth pair shaped to N
Mbit/s by a token-bucket filter (root, iproute2): a real link of that bandwidth
between two machines, where the all-reduce waits on the wire.

    .venv/bin/python benchmarks/compression.py [--hidden 2048 --layers 4 --batch 16 --rounds 3]
    .venv/bin/python benchmarks/compression.py --link-mbit 1000     # as root
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from disttrain_api import constants as C
from disttrain_api import model as api
from disttrain_trainer.modes.data import entry as data_mode
from disttrain_trainer.process.config import config_for
from disttrain_trainer.telemetry.step_metrics import Metrics

WORLD = 2
SETTINGS = ("none", "fp16", "powersgd")
SKIP = 5  # first steps: DDP rebuilds buckets, PowerSGD starts compressing at step 2
# The shaped link: namespace, interface and address of each rank.
NETNS = ("dtcompress0", "dtcompress1")
IFACES = ("dtcomp0", "dtcomp1")
ADDRS = ("10.252.0.1", "10.252.0.2")
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def shaped_link(mbit: int) -> Iterator[None]:
    """Two network namespaces joined by a veth pair, each end shaped to `mbit` Mbit/s."""
    for ns in NETNS:  # a previous run killed before its cleanup
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        for ns in NETNS:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", IFACES[0], "type", "veth", "peer", "name", IFACES[1])
        for ns, iface, addr in zip(NETNS, IFACES, ADDRS, strict=True):
            _ip("link", "set", iface, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")
            # Token bucket: `mbit` sustained, bursts of 1 ms worth, packets queue up to 50 ms.
            burst = max(mbit * 1000 // 8, 16 * 1024)
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", iface, "root", "tbf",
                            "rate", f"{mbit}mbit", "burst", str(burst), "latency", "50ms"],
                           check=True, capture_output=True, text=True)  # fmt: skip
        yield
    finally:
        for ns in NETNS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _enter_netns(rank: int) -> None:
    """Move this process (before gloo starts its threads) into rank's namespace."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    with open(f"/var/run/netns/{NETNS[rank]}") as f:
        if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {NETNS[rank]} failed")
    os.environ["GLOO_SOCKET_IFNAME"] = IFACES[rank]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(rank: int, ns: dict[str, Any], work: str, job: str, compression: str, port: int) -> None:
    torch.set_num_threads(1)
    if ns["link_mbit"]:
        _enter_netns(rank)
    os.environ[C.ENV_DATA_CACHE] = os.path.join(work, "data")
    spec = api.parse_spec({
        "mode": "data",
        "workers": {"replicas": WORLD},
        "model": {"name": "mlp", "hidden": ns["hidden"], "layers": ns["layers"]},
        "data": {"name": "synthetic", "batchSize": ns["batch"], "seed": 0, "shards": 2, "syntheticSamples": 4096},
        "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "decay": "none"},
        "training": {"steps": ns["steps"], "logIntervalSteps": 1, "gradientCompression": compression,
                     "bucketCapMB": ns["bucket_mb"],
                     "powerSGDRank": ns["rank"]},
        "checkpoint": {"intervalSteps": ns["steps"], "keep": 1},
    })  # fmt: skip
    run_dir = Path(work) / "runs" / job
    cfg = config_for(spec, job=job, rank=rank, world_size=WORLD, run_dir=run_dir,
                     checkpoint_root=Path(work) / "ckpt", master_port=port, metrics_port=0,
                     master_addr=ADDRS[0] if ns["link_mbit"] else "127.0.0.1")  # fmt: skip
    m = Metrics(job=job, rank=rank, mode="data", port=0, run_dir=run_dir)
    try:
        data_mode.run(cfg, metrics=m)
    finally:
        m.close()


def measure(ns: dict[str, Any], work: str, job: str, compression: str) -> dict[str, float]:
    mp.start_processes(_run, args=(ns, work, job, compression, _free_port()), nprocs=WORLD, start_method="spawn")
    recs = []
    for rank in range(WORLD):  # a step takes as long as its slower rank: average the two ranks' figures
        lines = (Path(work) / "runs" / job / f"metrics-rank{rank}.jsonl").read_text().splitlines()
        recs.append([r for r in map(json.loads, lines) if "event" not in r][SKIP:])
    med = statistics.median

    def fig(key: str) -> float:
        return statistics.fmean(med([r[key] for r in rank_recs]) for rank_recs in recs)

    return {k: fig(k) for k in ("step_s", "comm_exposed_s", "comm_busy_s", "compute_s", "data_s")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rank", type=int, default=2, help="PowerSGD rank")
    p.add_argument("--rounds", type=int, default=3)
    # One bucket by default: with several, torch's PowerSGD hook on gloo crashed here with a collective
    # mismatch (gloo "Received data size doesn't match expected size"), see benchmarks/README.md.
    p.add_argument("--bucket-mb", type=float, default=100.0, help="DDP bucketCapMB")
    p.add_argument("--link-mbit", type=int, default=0,
                   help="run the ranks over a veth link shaped to this many Mbit/s (root); 0: loopback")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    ns = vars(args)
    load0 = os.getloadavg()[0]
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
    link = shaped_link(args.link_mbit) if args.link_mbit else contextlib.nullcontext()
    with link, tempfile.TemporaryDirectory(prefix="disttrain-compress-") as work:
        for r in range(args.rounds):
            order = SETTINGS[r % 3:] + SETTINGS[: r % 3]  # rotate who runs first
            for s in order:
                rows[s].append(measure(ns, work, f"c{r}-{s}", s))
                print(f"round {r + 1} {s}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in rows[s][-1].items()),
                      flush=True)  # fmt: skip
    med = {s: {k: statistics.median(x[k] for x in rows[s]) for k in rows[s][0]} for s in SETTINGS}
    params = args.hidden * 64 + (args.layers - 1) * args.hidden * (args.hidden + 1) + args.hidden * 10
    print()
    print(f"MLP {args.hidden}x{args.layers} (~{params / 1e6:.1f} M params, {params * 4 / 1e6:.0f} MB fp32 gradients), "
          f"global batch {args.batch}, "
          f"{f'a veth link shaped to {args.link_mbit} Mbit/s' if args.link_mbit else 'loopback'}, bucketCapMB {args.bucket_mb}, {WORLD} gloo processes, 1 thread each, {args.steps} steps per run "
          f"(first {SKIP} skipped), medians of {args.rounds} rounds; load average {load0:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")  # fmt: skip
    print()
    print("| compression | step time | comm exposed | comm busy | compute | step time vs none |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = med["none"]["step_s"]
    for s in SETTINGS:
        m = med[s]
        print(f"| {s} | {m['step_s'] * 1e3:.1f} ms | {m['comm_exposed_s'] * 1e3:.1f} ms | {m['comm_busy_s'] * 1e3:.1f} ms "
              f"| {m['compute_s'] * 1e3:.1f} ms | {m['step_s'] / base:.2f} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "median": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
