"""disttrain's federated mode against Flower (flwr, its FedAvg), side by side in one run.

Same work for both: an MLP of width 4096 on digits (2 hidden layers, 17.1 M parameters,
68.6 MB of fp32 per model or update), 4 clients in 4 processes on 127.0.0.1, each
fitting one batch of 32 rows (its whole share) per round, so transport, (de)serialisation
and aggregation dominate; the server evaluates the global model on the test split
after every round (Flower: evaluate_fn; disttrain: the aggregator's evaluation).
Neither side checkpoints. Reported: median round time and accuracy per round of both.

Second part: aggregation ingest (PushUpdate: decode, checks, weighted sum) against raw
gRPC client streaming of the same bytes in the same chunks to a server that only
counts them. A separate sender process pre-builds its messages, so the figure is the
server's ingest rate.

    python benchmarks/federated_vs_flower.py [--rounds 5] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

CLIENTS = 4
BATCH = 32  # each client holds exactly one batch: one local step per round
SPEC: dict[str, Any] = {
    "mode": "federated",
    "model": {"name": "mlp", "hidden": 4096, "layers": 2},
    "data": {"name": "digits", "batchSize": BATCH, "seed": 0},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.0, "scaleLR": "none", "decay": "none"},
    "federated": {"clients": CLIENTS, "clientsPerRound": CLIENTS, "minAnsweredClients": CLIENTS,
                  "rounds": 5, "roundTimeoutSeconds": 600, "maxUpdateNorm": 1e9,
                  "partition": {"kind": "iid"}},
}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec_of(rounds: int):  # noqa: ANN201
    from disttrain_api.model import parse_spec

    raw = json.loads(json.dumps(SPEC))
    raw["federated"]["rounds"] = rounds
    return parse_spec(raw)


def client_data(spec, index: int):  # noqa: ANN001, ANN201
    from disttrain_trainer.data import load_dataset
    from disttrain_trainer.modes.federated import partition

    ds = load_dataset(spec)
    rows = partition.iid(ds.num_train, CLIENTS, spec.data.seed)[index][:BATCH]
    x, y = ds.batch(rows)
    return ds, torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y))


# ---------------------------------------------------------------- Flower


def flower_client(port: int, index: int, rounds: int) -> None:
    import flwr as fl
    import torch.nn.functional as F
    from disttrain_trainer.models import build_model

    torch.set_num_threads(1)
    spec = spec_of(rounds)
    ds, x, y = client_data(spec, index)
    model = build_model(spec, ds)
    keys = list(model.state_dict())

    class Client(fl.client.NumPyClient):
        def get_parameters(self, config):  # noqa: ANN001, ANN202
            return [v.numpy() for v in model.state_dict().values()]

        def fit(self, parameters, config):  # noqa: ANN001, ANN202
            model.load_state_dict({k: torch.from_numpy(np.asarray(p)) for k, p in zip(keys, parameters, strict=True)})
            opt = torch.optim.SGD(model.parameters(), lr=spec.optimizer.lr)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return self.get_parameters({}), len(y), {}

    # Flower's legacy client gives up at once when the server is not listening yet.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    fl.client.start_client(server_address=f"127.0.0.1:{port}", client=Client().to_client(), insecure=True)


def run_flower(rounds: int) -> dict[str, Any]:
    import flwr as fl
    from disttrain_trainer.data import load_dataset
    from disttrain_trainer.models import build_model
    from disttrain_trainer.process.precision import make_amp
    from disttrain_trainer.run_common import evaluate

    spec = spec_of(rounds)
    ds = load_dataset(spec)
    model = build_model(spec, ds)
    keys = list(model.state_dict())
    amp = make_amp("fp32", torch.device("cpu"))
    started: dict[int, float] = {}
    round_s: dict[int, float] = {}
    acc: dict[int, float] = {}

    def evaluate_fn(server_round, parameters, config):  # noqa: ANN001, ANN202
        model.load_state_dict({k: torch.from_numpy(np.asarray(p)) for k, p in zip(keys, parameters, strict=True)})
        a = evaluate(model, ds, amp)[1]
        if server_round > 0:
            acc[server_round] = a
            round_s[server_round] = time.perf_counter() - started[server_round]
        return 0.0, {"accuracy": a}

    class TimedFedAvg(fl.server.strategy.FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):  # noqa: ANN001, ANN202
            started[server_round] = time.perf_counter()
            return super().configure_fit(server_round, parameters, client_manager)

    init = fl.common.ndarrays_to_parameters([v.numpy() for v in model.state_dict().values()])
    strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=CLIENTS,
                           min_available_clients=CLIENTS, evaluate_fn=evaluate_fn, initial_parameters=init)  # fmt: skip
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=flower_client, args=(port, i, rounds), daemon=True) for i in range(CLIENTS)]
    for p in procs:
        p.start()
    try:
        fl.server.start_server(server_address=f"127.0.0.1:{port}", strategy=strategy,
                               config=fl.server.ServerConfig(num_rounds=rounds))  # fmt: skip
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return {"round_s": [round_s[r] for r in sorted(round_s)], "accuracy": [acc[r] for r in sorted(acc)]}


# ---------------------------------------------------------------- disttrain


def disttrain_client(port: int, key: bytes, index: int, rounds: int) -> None:
    from disttrain_trainer.models import build_model
    from disttrain_trainer.modes.federated.client import ClientRunner
    from disttrain_trainer.modes.federated.local_training import ClientState
    from disttrain_trainer.modes.federated.settings import client_ids
    from disttrain_trainer.tensor_transport.channel import aio_channel

    torch.set_num_threads(1)
    spec = spec_of(rounds)
    ds, x, y = client_data(spec, index)
    state = ClientState(cid=client_ids(CLIENTS)[index], x=x, y=y)

    async def main() -> None:
        channel = aio_channel(f"127.0.0.1:{port}", None)
        runner = ClientRunner(spec=spec, channel=channel, key=key, clients=[state],
                              make_model=lambda: build_model(spec, ds), log=lambda s: None)  # fmt: skip
        await runner.run()
        await channel.close()

    asyncio.run(main())


def run_disttrain(rounds: int) -> dict[str, Any]:
    from disttrain_trainer.data import load_dataset
    from disttrain_trainer.models import build_model
    from disttrain_trainer.modes.federated import inprocess
    from disttrain_trainer.modes.federated.aggregator import Aggregator
    from disttrain_trainer.modes.federated.entry import make_evaluator
    from disttrain_trainer.process.config import config_for
    from disttrain_trainer.telemetry.federated_series import FedMetrics
    from disttrain_trainer.tensor_transport import auth

    spec = spec_of(rounds)
    ds = load_dataset(spec)
    cfg = config_for(spec, run_dir=Path("/tmp/disttrain-bench"), checkpoint_root=Path("/tmp/disttrain-bench"))
    key = auth.new_key()
    agg = Aggregator(fed=spec.federated, model=build_model(spec, ds).state_dict(), key=key,
                     metrics=FedMetrics(job="bench", process="aggregator", port=0, log_path=None),
                     evaluate=make_evaluator(cfg, ds), log=lambda s: None)  # fmt: skip
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=disttrain_client, args=(port, key, i, rounds), daemon=True) for i in range(CLIENTS)]

    async def main() -> None:
        server, _ = await inprocess.start_server(agg, port=port)
        for p in procs:
            p.start()
        try:
            await agg.run()
            await agg.wait_clients_told(30.0)
        finally:
            await server.stop(1.0)

    try:
        asyncio.run(main())
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    h = agg.history
    return {"round_s": [r["step_s"] for r in h], "accuracy": [r["test_accuracy"] for r in h],
            "bytes_up": sum(r["bytes_up"] for r in h) / len(h), "bytes_down": sum(r["bytes_down"] for r in h) / len(h)}  # fmt: skip


# ---------------------------------------------------------------- ingest vs raw gRPC

RAW_METHOD = "/bench.Raw/Push"


def sender(agg_port: int, raw_port: int, key: bytes, numel: int, repeats: int, out: Any) -> None:
    import grpc
    from disttrain_trainer.modes.federated.bindings import JOIN, round_binding, wait_binding
    from disttrain_trainer.tensor_transport import auth, codec
    from disttrain_trainer.tensor_transport.channel import OPTIONS, aio_channel
    from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2 as pb
    from disttrain_trainer.tensor_transport.protos import tensor_transport_pb2_grpc as pbg

    update = [("w", torch.full((numel,), 1e-4))]
    raw_chunks = [c.data for c in codec.encode(codec.make_header(kind="update", round=0, tensors=update), update)]

    async def main() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"raw": [], "ingest": []}
        raw_channel = grpc.aio.insecure_channel(f"127.0.0.1:{raw_port}", options=OPTIONS)
        push_raw = raw_channel.stream_unary(RAW_METHOD)
        channel = aio_channel(f"127.0.0.1:{agg_port}", None)
        stub = pbg.FederatedStub(channel)
        creds = auth.Credentials.derive(key, ["client-0"])
        joined = await stub.Join(pb.JoinRequest(client_ids=["client-0"]), metadata=creds.metadata("client-0", "", JOIN))
        heard = joined.round
        for _ in range(repeats):
            t = time.perf_counter()
            await push_raw(iter(raw_chunks))
            times["raw"].append(time.perf_counter() - t)
            wait = creds.metadata("client-0", joined.session, wait_binding(heard))
            task = codec.decode_all([c async for c in stub.GetTask(pb.TaskRequest(client_id="client-0"), metadata=wait)],
                                    1 << 40)  # fmt: skip
            heard, attempt = task.header.round, int(task.header.scalars["attempt"])
            md = creds.metadata("client-0", joined.session, round_binding(heard, attempt))
            header = codec.make_header(kind="update", round=task.header.round, tensors=update,
                                       scalars={"attempt": attempt, "num_samples": 1})  # fmt: skip
            chunks = list(codec.encode(header, update))  # built before the clock starts, like raw_chunks
            t = time.perf_counter()
            reply = await stub.PushUpdate(iter(chunks), metadata=md)
            times["ingest"].append(time.perf_counter() - t)
            assert reply.accepted, reply.reason
        await raw_channel.close()
        await channel.close()
        return times

    out.put(asyncio.run(main()))


def run_ingest(numel: int, repeats: int) -> dict[str, Any]:
    import grpc
    from disttrain_api.model import parse_spec
    from disttrain_trainer.modes.federated import inprocess
    from disttrain_trainer.modes.federated.aggregator import Aggregator
    from disttrain_trainer.telemetry.federated_series import FedMetrics
    from disttrain_trainer.tensor_transport import auth
    from disttrain_trainer.tensor_transport.channel import SERVER_OPTIONS

    spec = parse_spec({"mode": "federated", "federated": {
        "clients": 1, "clientsPerRound": 1, "minAnsweredClients": 1, "rounds": repeats,
        "maxUpdateNorm": 1e9, "roundTimeoutSeconds": 600}})  # fmt: skip
    key = auth.new_key()
    agg = Aggregator(fed=spec.federated, model={"w": torch.zeros(numel)}, key=key,
                     metrics=FedMetrics(job="bench", process="aggregator", port=0, log_path=None), log=lambda s: None)  # fmt: skip
    received = [0]

    async def count(request_iterator, context):  # noqa: ANN001, ANN202
        async for chunk in request_iterator:
            received[0] += len(chunk)
        return b""

    ctx = mp.get_context("spawn")
    out = ctx.Queue()

    async def main() -> dict[str, list[float]]:
        server, agg_port = await inprocess.start_server(agg)
        raw = grpc.aio.server(options=SERVER_OPTIONS)
        raw.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "bench.Raw", {"Push": grpc.stream_unary_rpc_method_handler(count)})])  # fmt: skip
        raw_port = raw.add_insecure_port("127.0.0.1:0")
        await raw.start()
        p = ctx.Process(target=sender, args=(agg_port, raw_port, key, numel, repeats, out), daemon=True)
        p.start()
        rounds = asyncio.create_task(agg.run())
        try:
            while p.is_alive() and out.empty():
                await asyncio.sleep(0.05)
            return await asyncio.to_thread(out.get, True, 60)
        finally:
            rounds.cancel()
            p.join(timeout=10)
            await server.stop(0)
            await raw.stop(0)

    times = asyncio.run(main())
    nbytes = numel * 4
    raw_mbs = nbytes / statistics.median(times["raw"]) / 1e6
    ingest_mbs = nbytes / statistics.median(times["ingest"]) / 1e6
    return {"bytes": nbytes, "raw_MBps": raw_mbs, "ingest_MBps": ingest_mbs, "ratio": ingest_mbs / raw_mbs,
            "raw_s": times["raw"], "ingest_s": times["ingest"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("flower", "disttrain", "ingest"), action="append")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    only = set(args.only or ("flower", "disttrain", "ingest"))
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spec = spec_of(args.rounds)
    from disttrain_trainer.data import load_dataset
    from disttrain_trainer.models import build_model

    params = sum(p.numel() for p in build_model(spec, load_dataset(spec)).parameters())
    print(f"model: MLP 2 x 4096 on digits, {params / 1e6:.1f} M parameters, {params * 4 / 1e6:.1f} MB fp32; "
          f"{CLIENTS} clients, {args.rounds} rounds; load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    result: dict[str, Any] = {"params": params, "load_before": os.getloadavg()}
    for name, fn in (("disttrain", run_disttrain), ("flower", run_flower)):
        if name not in only:
            continue
        r = fn(args.rounds)
        result[name] = r
        print(f"{name:9s} median round {statistics.median(r['round_s']):6.2f} s  rounds "
              f"{' '.join(f'{s:.2f}' for s in r['round_s'])}  accuracy {' '.join(f'{a:.3f}' for a in r['accuracy'])}",
              flush=True)  # fmt: skip
    if "flower" in result and "disttrain" in result:
        ratio = statistics.median(result["disttrain"]["round_s"]) / statistics.median(result["flower"]["round_s"])
        result["round_time_ratio"] = ratio
        print(f"disttrain / flower median round time: {ratio:.3f} (target <= 0.333)")
    if "ingest" in only:
        r = run_ingest(params, args.repeats)
        result["ingest"] = r
        print(f"ingest of {r['bytes'] / 1e6:.1f} MB: raw gRPC client streaming {r['raw_MBps']:.0f} MB/s, "
              f"aggregator PushUpdate {r['ingest_MBps']:.0f} MB/s, ratio {r['ratio']:.2f} (target >= 0.8)")  # fmt: skip
    result["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
