"""One worker with maxStaleness 0 takes exactly the steps of synchronous SGD (same batches, same schedule).

A real shard server on 127.0.0.1 and the real worker loop in this process; the
reference is a plain loop with the trainer's own optimizer and lr schedule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.models import build_model
from disttrain_trainer.modes.paramserver.entry import shard_config, shard_tensors, start_server
from disttrain_trainer.modes.paramserver.server import Shard
from disttrain_trainer.modes.paramserver.settings import PSSettings
from disttrain_trainer.modes.paramserver.worker import Worker
from disttrain_trainer.optim import build_optimizer, build_scheduler
from disttrain_trainer.process.config import config_for
from disttrain_trainer.run_common import loss_fn_for
from disttrain_trainer.telemetry.paramserver_series import ServerMetrics, WorkerMetrics
from disttrain_trainer.tensor_transport import auth

STEPS = 25
KEY = auth.new_key()


@pytest.mark.parametrize("optimizer", [
    {"name": "sgd", "lr": 0.1, "momentum": 0.9, "warmupSteps": 5, "decay": "cosine"},
    {"name": "adam", "lr": 0.003, "decay": "linear"},
])  # fmt: skip
def test_one_worker_with_staleness_zero_equals_synchronous_sgd(tmp_path: Path, optimizer: dict) -> None:
    spec = parse_spec({
        "mode": "paramserver", "workers": {"replicas": 1},
        "model": {"name": "mlp", "hidden": 32}, "data": {"name": "digits", "batchSize": 64, "seed": 3},
        "optimizer": {**optimizer, "scaleLR": "linear", "baseBatchSize": 128},
        "training": {"steps": STEPS, "logIntervalSteps": 5},
        "paramServer": {"maxStaleness": 0, "shards": 2},
    })  # fmt: skip
    ds = load_dataset(spec, cache_dir=tmp_path / "data")
    cfg = config_for(spec, run_dir=tmp_path / "run", checkpoint_root=tmp_path / "ckpt")

    # Reference: synchronous SGD, one process, the data mode's sampler, optimizer and schedule.
    ref = build_model(spec, ds)
    opt = build_optimizer(ref.parameters(), spec.optimizer, spec.data.batch_size)
    sched = build_scheduler(opt, spec.optimizer, spec.data.batch_size, STEPS)
    sampler = GlobalBatchSampler(ds.num_train, spec.data.batch_size, spec.data.seed)
    loss_fn = loss_fn_for(ds)
    for _ in range(STEPS):
        x, y = ds.batch(sampler.next_indices())
        opt.zero_grad(set_to_none=True)
        loss_fn(ref(torch.from_numpy(np.asarray(x))), torch.from_numpy(np.asarray(y))).backward()
        opt.step()
        sched.step()

    # Parameter server: two shards (by tensor), one worker, real gRPC.
    model = build_model(spec, ds)
    servers, addrs = [], []
    for i in range(2):
        s = PSSettings(ps=spec.param_server, role="server", addrs=("x:1", "x:2"), index=i, workers=1, tls=None,
                       tls_server_name=None, identity_dir=tmp_path)  # fmt: skip
        shard = Shard(shard_config(cfg, s, None), shard_tensors(model, s),
                      ServerMetrics(job="t", shard=i, port=0, log_path=None))  # fmt: skip
        server, port = start_server(shard, "127.0.0.1:0", key=KEY, log=lambda s: None)
        servers.append((server, shard))
        addrs.append(f"127.0.0.1:{port}")
    torch.manual_seed(123)
    worker_model = build_model(spec, ds)
    with torch.no_grad():  # the worker's own initial values must not matter: the first pull replaces them
        for p in worker_model.parameters():
            p.add_(torch.randn_like(p))
    metrics = WorkerMetrics(job="t", rank=0, port=0, log_path=tmp_path / "w0.jsonl")
    worker = Worker(spec=spec, index=0, workers=1, addrs=tuple(addrs), model=worker_model, ds=ds,
                    loss_fn=loss_fn, metrics=metrics, creds=auth.Credentials.derive(KEY, ["worker-0"]))  # fmt: skip
    try:
        worker.run()
    finally:
        worker.close()
        metrics.close()
        for server, _ in servers:
            server.stop(grace=None).wait()
    assert worker.step == STEPS
    assert [shard.version for _, shard in servers] == [STEPS, STEPS]
    assert all(shard.stats["staleness:0"] == STEPS and shard.stats["accepted"] == STEPS for _, shard in servers)
    for (name, p), q in zip(worker_model.named_parameters(), ref.parameters(), strict=True):
        diff = float((p.detach() - q.detach()).abs().max())
        assert diff <= 1e-6, (name, diff)
    assert sum(len(shard.names) for _, shard in servers) == len(list(ref.parameters()))
