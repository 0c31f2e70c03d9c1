"""A replica that joins a fault-tolerant job receives a live peer's weights, optimizer, scheduler and
sampler state over torchft's HTTP transport (ft_replica._AdvertisedHTTPTransport). What it receives
is read with the weights-only unpickler: a pod that serves a pickle payload in its place (one that
got itself chosen as the recovery source) runs no code in the replica, which torchft's own
transport would run. What a replica sends is checked to be tensors and plain values before it goes."""

from __future__ import annotations

import http.server
import io
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from disttrain_api import model as api
from disttrain_trainer.checkpoints.safe_state import UnsafeCheckpoint
from disttrain_trainer.data import GlobalBatchSampler
from disttrain_trainer.modes.data.ft_replica import _AdvertisedHTTPTransport, plain_state
from disttrain_trainer.optim import build_optimizer, build_scheduler
from torch.distributed._serialization import _streaming_save
from torchft.checkpointing.http_transport import HTTPTransport

TIMEOUT = timedelta(seconds=20)


class Payload:
    """Unpickled with the standard loader, this creates `target`: proof the sender's code ran."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.target, "code ran"))


def _replica_state() -> tuple[torch.nn.Module, dict[str, Any]]:
    """A replica's state as ReplicaRun.healable holds it, after a few steps of AdamW with warmup."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt_spec = api.parse_spec({"mode": "data", "data": {"batchSize": 32},
                               "optimizer": {"name": "adamw", "lr": 0.01, "warmupSteps": 5}}).optimizer  # fmt: skip
    optimizer = build_optimizer(model.parameters(), opt_spec, 32)
    scheduler = build_scheduler(optimizer, opt_spec, 32, 100)
    sampler = GlobalBatchSampler(100, 32, 0, 1, 4)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        scheduler.step()
        sampler.next_indices()
    state = {"step": 3, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "scaler": None, "sampler": sampler.state_dict(), "sync": None,
             "gradBuckets": [[2, 3], [0, 1]]}  # fmt: skip
    return model, state


def test_a_joining_replica_receives_a_peers_whole_state() -> None:
    model, state = _replica_state()
    peer = _AdvertisedHTTPTransport("127.0.0.1", TIMEOUT)
    joining = _AdvertisedHTTPTransport("127.0.0.1", TIMEOUT)
    try:
        # As torchft's Manager wraps it (_manager_state_dict): the replica's state and its own step.
        sent = {"user": {"default": plain_state(lambda: state)()}, "torchft": {"step": 3, "batches_committed": 12}}
        peer.send_checkpoint([1], 3, sent, TIMEOUT)
        got = joining.recv_checkpoint(0, peer.metadata(), 3, TIMEOUT)
    finally:
        peer.shutdown(wait=False)
        joining.shutdown(wait=False)
    assert got["torchft"] == {"step": 3, "batches_committed": 12}
    user = got["user"]["default"]
    for k, v in model.state_dict().items():
        assert torch.equal(user["model"][k], v)
    fresh, _ = _replica_state()
    opt_spec = api.parse_spec({"mode": "data", "optimizer": {"name": "adamw"}}).optimizer
    optimizer = build_optimizer(fresh.parameters(), opt_spec, 32)
    optimizer.load_state_dict(user["optimizer"])  # loads: the same shapes, steps and moments
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert user["scheduler"]["last_epoch"] == state["scheduler"]["last_epoch"] == 3
    assert user["sampler"] == state["sampler"] and user["gradBuckets"] == [[2, 3], [0, 1]]


@pytest.fixture
def hostile_peer(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server that answers every checkpoint request with a pickle payload in torch's streaming
    format, as a compromised pod would; yields the address to ask and the file the payload creates."""
    target = tmp_path / "pwned"
    buf = io.BytesIO()
    _streaming_save({"user": {"default": {"model": Payload(target)}}, "torchft": {"step": 9, "batches_committed": 0}},
                    buf)  # fmt: skip
    body = buf.getvalue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-type", "application/octet-stream")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/checkpoint/", target
    finally:
        server.shutdown()
        server.server_close()


def test_a_pickle_served_as_a_peers_state_is_refused_unread(hostile_peer: tuple[str, Path]) -> None:
    address, target = hostile_peer
    joining = _AdvertisedHTTPTransport("127.0.0.1", TIMEOUT)
    try:
        with pytest.raises(UnsafeCheckpoint) as refused:
            joining.recv_checkpoint(0, address, 9, TIMEOUT)
    finally:
        joining.shutdown(wait=False)
    assert not target.exists()
    msg = str(refused.value)
    assert f"the state a peer served at {address}9/full" in msg and "refused unread" in msg
    assert "(it names getattr)" in msg  # the global the payload reaches Path.write_text through
    assert "meta.json" not in msg  # (the hint about older checkpoint files is for files)
    # The transport torchft ships reads the same bytes with the standard unpickler: the code runs.
    HTTPTransport._load_from_address(f"{address}9/full", TIMEOUT)
    assert target.read_text() == "code ran"


def test_a_value_the_receiver_would_refuse_fails_at_the_sender_naming_its_key() -> None:
    _, state = _replica_state()
    state["sampler"] = {**state["sampler"], "order": np.arange(3)}
    with pytest.raises(TypeError, match=r"the state sent to a joining replica\['sampler'\]\['order'\]"):
        plain_state(lambda: state)()
