"""Parameter server (Downpour SGD) vs synchronous DDP on digits, and the transport vs raw gRPC.

(a) Time to 0.95 test accuracy on digits: `disttrain local` runs of the same MLP, the same
    global batch (128) and the same data, synchronous DDP (mode data) vs the parameter server
    (mode paramserver, 1 shard) at 2 and 4 workers; rank 0 evaluates every EVAL steps and
    the figure is the time from launch to the first evaluation >= 0.95 (process start-up
    included, the same for both modes), plus the staleness distribution of the pushes.
(b) Push/pull throughput of the parameter server's gRPC service (the shared chunked-tensor
    transport; server in another process) vs raw gRPC streaming of the same bytes in the same
    chunk size, two ways: pre-built `bytes` that nothing is done with (gRPC alone), and the
    bytes of the same tensors, copied out of tensor memory by the sender and into tensor
    memory by the receiver (the least a program moving tensors through Python gRPC does).

    .venv/bin/python benchmarks/paramserver.py [--json FILE] [--skip-time] [--skip-transport]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

EVAL = 10
THRESHOLD = 0.95
MLP = "{name: mlp, hidden: 128, layers: 2}"
DATA = "{name: digits, batchSize: 128, seed: 0}"
MANIFESTS = {
    # The data-parallel example's recipe (reaches ~0.97).
    "data": """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: bench-{name}}}
spec:
  mode: data
  workers: {{replicas: {workers}}}
  model: {MLP}
  data: {DATA}
  optimizer: {{name: sgd, lr: 0.1, momentum: 0.9, weightDecay: 0.0001, scaleLR: linear, baseBatchSize: 128,
               warmupSteps: 30, decay: cosine}}
  training: {{steps: 400, evalIntervalSteps: {EVAL}, logIntervalSteps: 10}}
  checkpoint: {{intervalSteps: 1000, keep: 1}}
""",
    # The paramserver example's recipe (steps = iterations per worker).
    "paramserver": """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {{name: bench-{name}}}
spec:
  mode: paramserver
  workers: {{replicas: {workers}}}
  model: {MLP}
  data: {DATA}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9, scaleLR: none, warmupSteps: 20, decay: cosine}}
  training: {{steps: 300, evalIntervalSteps: {EVAL}, logIntervalSteps: 10}}
  paramServer: {{maxStaleness: 8, shards: 1}}
  checkpoint: {{intervalSteps: 100000, keep: 1}}
""",
}


# ------------------------------------------------------------------ (a) time to accuracy


def time_to_accuracy(mode: str, workers: int, root: Path) -> dict[str, Any]:
    name = f"{mode}-{workers}"
    manifest = root / f"{name}.yaml"
    manifest.write_text(MANIFESTS[mode].format(name=name, workers=workers, MLP=MLP, DATA=DATA, EVAL=EVAL))
    run_dir = root / name
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "disttrain_cli", "local", str(manifest), "--run-dir",
                           str(run_dir), "--fresh", "--no-progress", "--metrics-port", "0"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics-rank0.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in recs if r.get("event") == "eval" and "test_accuracy" in r]
    hit = next((r for r in evals if r["test_accuracy"] >= THRESHOLD), None)
    summary = json.loads((run_dir / "summary.json").read_text())
    final = summary.get("testAccuracy", summary.get("test_accuracy"))
    out: dict[str, Any] = {
        "mode": mode, "workers": workers, "wallS": wall,
        "timeToTargetS": hit["time"] - t0 if hit else None, "stepsToTarget": hit["step"] if hit else None,
        "finalAccuracy": final,
    }  # fmt: skip
    if mode == "paramserver":
        hist = {int(k): v for k, v in summary["stalenessHistogram"].items()}
        values = sorted(s for s, n in hist.items() for _ in range(n))
        out.update(
            stalenessHistogram=hist, pushesAccepted=summary["pushesAccepted"],
            pushesRejected=summary["pushesRejected"],
            stalenessP50=values[len(values) // 2], stalenessP90=values[int(len(values) * 0.9)],
            stalenessP99=values[int(len(values) * 0.99)], stalenessMax=values[-1],
            commFraction=summary["commFraction"], computeFraction=summary["computeFraction"],
        )  # fmt: skip
    return out


# ------------------------------------------------------------------ (b) transport


def _tensors(total_mb: int, count: int) -> list[tuple[str, Any]]:
    import torch

    n = total_mb * (1 << 20) // 4 // count
    g = torch.Generator().manual_seed(0)
    return [(f"t{i}", torch.randn(n, generator=g)) for i in range(count)]


def _serve(total_mb: int, count: int, key: bytes, ports: Any, stop: Any) -> None:
    import grpc
    import torch
    from disttrain_api.model import parse_spec
    from disttrain_trainer.modes.paramserver.entry import start_server
    from disttrain_trainer.modes.paramserver.server import Shard, ShardConfig
    from disttrain_trainer.telemetry.paramserver_series import ServerMetrics
    from disttrain_trainer.tensor_transport.channel import SERVER_OPTIONS
    from disttrain_trainer.tensor_transport.codec import CHUNK_BYTES
    from disttrain_trainer.tensor_transport.frames import reuse_freed_memory

    reuse_freed_memory()  # as the paramserver processes do; the raw server shares the process
    torch.set_num_threads(1)
    opt = parse_spec({"optimizer": {"name": "sgd", "momentum": 0.0, "scaleLR": "none", "decay": "none"}}).optimizer
    cfg = ShardConfig(index=0, workers=1, steps=10**9, max_staleness=10**9, optimizer=opt, push_batch=256,
                      checkpoint_dir=None, checkpoint_interval=10**9, keep=1)  # fmt: skip
    shard = Shard(cfg, _tensors(total_mb, count), ServerMetrics(job="bench", shard=0, port=0, log_path=None))
    server, ps_port = start_server(shard, "127.0.0.1:0", key=key, log=lambda s: None)

    blob = bytes(total_mb << 20)
    chunks = [blob[i : i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)]

    def sink(it: Iterator[bytes], ctx: Any) -> bytes:
        n = 0
        for c in it:
            n += len(c)
        return str(n).encode()

    def source(req: bytes, ctx: Any) -> Iterator[bytes]:
        yield from chunks

    held = _tensors(total_mb, count)  # the raw-with-copies side holds tensors like the shard does
    dest = memoryview(bytearray(total_mb << 20))

    def sink_copy(it: Iterator[bytes], ctx: Any) -> bytes:
        n = 0
        for c in it:  # received bytes -> tensor memory: the one copy a receiver must make
            dest[n : n + len(c)] = c
            n += len(c)
        return str(n).encode()

    def source_copy(req: bytes, ctx: Any) -> Iterator[bytes]:
        for _, t in held:  # tensor memory -> bytes: the one copy a sender must make
            view = memoryview(t.numpy()).cast("B")
            for i in range(0, len(view), CHUNK_BYTES):
                yield bytes(view[i : i + CHUNK_BYTES])

    raw = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=SERVER_OPTIONS)
    raw.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", {
        "Sink": grpc.stream_unary_rpc_method_handler(sink),
        "Source": grpc.unary_stream_rpc_method_handler(source),
        "SinkCopy": grpc.stream_unary_rpc_method_handler(sink_copy),
        "SourceCopy": grpc.unary_stream_rpc_method_handler(source_copy),
    }),))  # fmt: skip
    raw_port = raw.add_insecure_port("127.0.0.1:0")
    raw.start()
    ports.put((ps_port, raw_port))
    stop.wait()
    apply = shard.metrics.apply_seconds
    ports.put(apply._sum.get() / max(1.0, shard.stats["accepted"]))
    server.stop(None)
    raw.stop(None)


def transport(total_mb: int, count: int, reps: int) -> dict[str, Any]:
    import grpc
    import torch
    from disttrain_trainer.modes.paramserver.service import ShardClient
    from disttrain_trainer.tensor_transport import auth
    from disttrain_trainer.tensor_transport.channel import OPTIONS
    from disttrain_trainer.tensor_transport.codec import CHUNK_BYTES
    from disttrain_trainer.tensor_transport.frames import reuse_freed_memory

    reuse_freed_memory()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    key = auth.new_key()
    proc = ctx.Process(target=_serve, args=(total_mb, count, key, ports, stop), daemon=True)
    proc.start()
    ps_port, raw_port = ports.get(timeout=120)
    nbytes = total_mb << 20
    client = ShardClient(f"127.0.0.1:{ps_port}", max_bytes=nbytes, creds=auth.Credentials.derive(key, ["worker-0"]))
    channel = grpc.insecure_channel(f"127.0.0.1:{raw_port}", options=OPTIONS)
    sink = channel.stream_unary("/bench.Raw/Sink")
    source = channel.unary_stream("/bench.Raw/Source")
    sink_copy = channel.stream_unary("/bench.Raw/SinkCopy")
    source_copy = channel.unary_stream("/bench.Raw/SourceCopy")
    blob = bytes(nbytes)
    chunks = [blob[i : i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)]
    grads = [(n, t * 1e-6) for n, t in _tensors(total_mb, count)]
    model = {n: torch.zeros_like(t) for n, t in grads}  # a worker pulls into its own parameters
    flat = memoryview(bytearray(nbytes))  # the raw-with-copies client's "model"

    def tensor_chunks() -> Iterator[bytes]:
        for _, t in grads:
            view = memoryview(t.numpy()).cast("B")
            for i in range(0, len(view), CHUNK_BYTES):
                yield bytes(view[i : i + CHUNK_BYTES])

    def pull_copy() -> int:
        n = 0
        for c in source_copy(b""):
            flat[n : n + len(c)] = c
            n += len(c)
        return n

    times: dict[str, list[float]] = {k: [] for k in ("push", "rawPush", "rawPushCopy", "pull", "rawPull", "rawPullCopy")}
    try:
        first = client.pull(worker="worker-0", version=-1, incarnation="")
        version, inc = first.version, first.incarnation
        for i in range(reps + 1):  # the first round warms up; pairs alternate their order
            order = list(times) if i % 2 else list(reversed(times))
            for what in order:
                t0 = time.perf_counter()
                if what == "push":
                    r = client.push(worker="worker-0", version=version, incarnation=inc, grads=grads)
                    assert r.accepted, r.reason
                    version += 1
                elif what == "rawPush":
                    assert int(sink(iter(chunks))) == nbytes
                elif what == "rawPushCopy":
                    assert int(sink_copy(tensor_chunks())) == nbytes
                elif what == "rawPullCopy":
                    assert pull_copy() == nbytes
                elif what == "pull":
                    got = client.pull(worker="worker-0", version=-1, incarnation=inc, into=model)
                    assert sum(t.numel() * 4 for _, t in got.tensors) == nbytes
                else:
                    assert sum(len(c) for c in source(b"")) == nbytes
                if i:
                    times[what].append(time.perf_counter() - t0)
    finally:
        client.close()
        channel.close()
        stop.set()
    apply_s = ports.get(timeout=60)
    proc.join(timeout=30)
    med = {k: statistics.median(v) for k, v in times.items()}
    mbs = {k: nbytes / v / 1e6 for k, v in med.items()}
    return {"bytes": nbytes, "tensors": count, "chunkBytes": CHUNK_BYTES, "reps": reps, "medianS": med,
            "MBps": mbs, "pushRatio": mbs["push"] / mbs["rawPush"], "pullRatio": mbs["pull"] / mbs["rawPull"],
            "pushRatioCopy": mbs["push"] / mbs["rawPushCopy"], "pullRatioCopy": mbs["pull"] / mbs["rawPullCopy"],
            "serverApplyS": apply_s}  # fmt: skip


# ------------------------------------------------------------------ report


def table(runs: list[dict[str, Any]], tr: dict[str, Any] | None) -> str:
    lines = []
    if runs:
        lines += ["| mode | workers | time to 0.95 (s, from launch) | steps to 0.95 (per worker) | final accuracy | "
                  "wall (s) | staleness p50 / p90 / p99 / max | pushes accepted / rejected |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for r in runs:
            ttt = f"{r['timeToTargetS']:.1f}" if r["timeToTargetS"] is not None else "not reached"
            stale = (f"{r['stalenessP50']} / {r['stalenessP90']} / {r['stalenessP99']} / {r['stalenessMax']}"
                     if "stalenessP50" in r else "-")  # fmt: skip
            pushes = f"{r['pushesAccepted']} / {r['pushesRejected']}" if "pushesAccepted" in r else "-"
            mode = "synchronous DDP" if r["mode"] == "data" else "parameter server"
            lines.append(f"| {mode} | {r['workers']} | {ttt} | {r['stepsToTarget'] or '-'} | "
                         f"{r['finalAccuracy']:.4f} | {r['wallS']:.1f} | {stale} | {pushes} |")  # fmt: skip
    if tr:
        mb = tr["bytes"] / 1e6
        lines += ["", f"| transport ({mb:.0f} MB in {tr['tensors']} tensors, {tr['chunkBytes'] >> 20} MiB chunks, "
                  f"median of {tr['reps']}) | parameter server | raw gRPC, pre-built bytes (ratio) | "
                  "raw gRPC, tensor bytes copied in/out (ratio) | target 0.8x raw |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for what, label in (("push", "push (client stream)"), ("pull", "pull (server stream)")):
            extra = f", server apply {tr['serverApplyS'] * 1000:.0f} ms of it" if what == "push" else ""
            r1, r2 = tr[f"{what}Ratio"], tr[f"{what}RatioCopy"]
            raw_key = "rawPush" if what == "push" else "rawPull"
            lines.append(f"| {label} | {tr['MBps'][what]:.0f} MB/s ({tr['medianS'][what] * 1000:.0f} ms{extra}) | "
                         f"{tr['MBps'][raw_key]:.0f} MB/s ({r1:.2f}) | {tr['MBps'][raw_key + 'Copy']:.0f} MB/s "
                         f"({r2:.2f}) | pre-built {'met' if r1 >= 0.8 else 'MISSED'}, "
                         f"copied {'met' if r2 >= 0.8 else 'MISSED'} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--skip-time", action="store_true", help="skip (a), the disttrain local runs")
    p.add_argument("--skip-transport", action="store_true", help="skip (b)")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--mb", type=int, default=64, help="model bytes for (b), in MiB")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args(argv)
    runs: list[dict[str, Any]] = []
    tr = None if a.skip_transport else transport(a.mb, 4, a.reps)
    if not a.skip_time:
        with tempfile.TemporaryDirectory(prefix="ps-bench-") as tmp:
            for w in a.workers:
                for mode in ("data", "paramserver"):
                    runs.append(time_to_accuracy(mode, w, Path(tmp)))
                    print(f"{mode} x{w}: {runs[-1]['timeToTargetS']}", file=sys.stderr, flush=True)
    print(table(runs, tr))
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "transport": tr}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
