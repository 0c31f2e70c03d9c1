"""A replica that joins a fault-tolerant job receives a live peer's weights, optimizer, scheduler and
sampler state over torchft's HTTP transport (ft_replica._AdvertisedHTTPTransport). What it receives
is read with the weights-only unpickler: a pod that serves a pickle payload in its place (one that
got itself chosen as the recovery source) runs no code in the replica, which torchft's own
transport would run. A forged record length is refused before anything is allocated for it, and a
peer that trickles its bytes is given up at the transfer's timeout. What a replica sends is checked
to be tensors and plain values before it goes."""

from __future__ import annotations

import http.server
import io
import pickle
import threading
import time
from collections.abc import Callable, Iterator
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
from torch.distributed._serialization import _Entry, _streaming_save
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
    peer = _AdvertisedHTTPTransport("127.0.0.1", TIMEOUT, lambda: state)
    joining = _AdvertisedHTTPTransport("127.0.0.1", TIMEOUT, lambda: state)
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


Body = Callable[[Any], None]  # writes a response body to the handler's wfile


@pytest.fixture
def serve() -> Iterator[Callable[[Body], str]]:
    """Starts HTTP servers that answer every request with a body of the test's choosing, as a
    compromised pod would; returns the checkpoint address to ask."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(body: Body) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-type", "application/octet-stream")
                self.end_headers()
                try:
                    body(self.wfile)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the replica gave up on it

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/checkpoint/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _payload_body(target: Path) -> Body:
    buf = io.BytesIO()
    _streaming_save({"user": {"default": {"model": Payload(target)}}, "torchft": {"step": 9, "batches_committed": 0}},
                    buf)  # fmt: skip
    return lambda w: w.write(buf.getvalue())


def _receive(address: str, own: dict[str, Any] | None = None, timeout: timedelta = TIMEOUT) -> Any:
    joining = _AdvertisedHTTPTransport("127.0.0.1", timeout, lambda: own if own is not None else {})
    try:
        return joining.recv_checkpoint(0, address, 9, timeout)
    finally:
        joining.shutdown(wait=False)


def test_a_pickle_served_as_a_peers_state_is_refused_unread(serve: Callable[[Body], str], tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    address = serve(_payload_body(target))
    with pytest.raises(UnsafeCheckpoint) as refused:
        _receive(address)
    assert not target.exists()
    msg = str(refused.value)
    assert f"the state a peer served at {address}9/full" in msg and "refused unread" in msg
    assert "(it names getattr)" in msg  # the global the payload reaches Path.write_text through
    assert "meta.json" not in msg  # (the hint about older checkpoint files is for files)
    # The transport torchft ships reads the same bytes with the standard unpickler: the code runs.
    HTTPTransport._load_from_address(f"{address}9/full", TIMEOUT)
    assert target.read_text() == "code ran"


def test_a_forged_record_length_is_refused_before_it_is_allocated(serve: Callable[[Body], str]) -> None:
    """The stream's header names each record's length, and the reader asks the socket for that many
    bytes at once: 10**15 would be a MemoryError, or the kernel's OOM killer, without the bound."""
    header = pickle.dumps([_Entry(key="data.pkl", is_storage=False, length=10**15)], protocol=2)
    address = serve(lambda w: w.write(header + b"x" * 1024))
    own = {"model": {"w": torch.zeros(1000)}}  # 4000 bytes: the limit is 8 x that + the slack
    with pytest.raises(UnsafeCheckpoint, match=r"is larger than the \d+ bytes a replica's state can be"):
        _receive(address, own)


def test_a_peer_that_trickles_its_state_is_given_up_at_the_timeout(serve: Callable[[Body], str]) -> None:
    """A byte every 0.5 s keeps the socket's own timeout (2 s) from firing; the transfer's deadline does,
    also inside a line of the header (a global's name: 30-odd bytes, 15 s at this pace)."""
    state = io.BytesIO()
    _streaming_save({"user": {"default": {"w": torch.zeros(10_000)}}, "torchft": {"step": 9}}, state)

    def trickle(w: Any) -> None:
        for b in state.getvalue():
            w.write(bytes([b]))
            w.flush()
            time.sleep(0.5)

    address = serve(trickle)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not arrive within 2 s \(\d+ bytes came\)"):
        _receive(address, {"w": torch.zeros(10_000)}, timeout=timedelta(seconds=2))
    assert time.monotonic() - start < 8


def test_a_value_the_receiver_would_refuse_fails_at_the_sender_naming_its_key() -> None:
    _, state = _replica_state()
    state["sampler"] = {**state["sampler"], "order": np.arange(3)}
    with pytest.raises(TypeError, match=r"the state sent to a joining replica\['sampler'\]\['order'\]"):
        plain_state(lambda: state)()
