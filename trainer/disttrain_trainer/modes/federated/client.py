"""Client processes: each hosts several simulated clients, each with its own rows of the data.

A client long-polls the aggregator for work; when sampled it receives the
global model, trains `localEpochs` on its rows (FedProx adds the proximal
term mu/2 ||w - w_global||^2), and sends the update (local - global):
compressed, or masked for secure aggregation. Training is serialised per
process (one model at a time on the process's cores); waiting is asyncio.

Every call to the aggregator, the secure stages included, goes through `retry`:
a call cut by an aggregator restart (the connection refused or reset, the
stream cancelled or broken off mid-way) is repeated with exponential backoff
for up to `patience_s`. The restarted aggregator resumes from its checkpoint
and refuses anything about a round it no longer plays, so the client gives
that round up and asks for work again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from disttrain_api.model import JobSpec
from torch import nn

from ...tensor_transport import auth, codec
from ...tensor_transport.protos import tensor_transport_pb2 as pb
from ...tensor_transport.protos import tensor_transport_pb2_grpc as pbg
from . import compression, secure_client
from . import faults as hooks
from .bindings import JOIN, round_binding, wait_binding
from .local_training import ClientState, train_local

T = TypeVar("T")
# The client trusts its aggregator's model stream up to this size (the aggregator is the one that verifies).
MAX_MODEL_BYTES = 1 << 40
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 5.0
# What an aggregator that restarts or is overloaded looks like from here: connection refused or reset
# (UNAVAILABLE), its handlers cancelled as its server stops (CANCELLED), a stream reset mid-way
# (INTERNAL / UNKNOWN), a full server (RESOURCE_EXHAUSTED). A refused credential is not in the list:
# retrying cannot fix it.
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED)  # fmt: skip
# Joins in a row that a GetTask may ask for (its token named a passed session or round): more means
# the rounds run faster than this client can join, or something refuses every token.
MAX_REJOINS = 20


class Disconnected(RuntimeError):
    """The aggregator stayed unreachable longer than the client's patience."""


class ClientRunner:
    """Runs the simulated clients of one process against one aggregator channel."""

    def __init__(
        self,
        *,
        spec: JobSpec,
        channel: grpc.aio.Channel,
        key: bytes | auth.Credentials,
        clients: list[ClientState],
        make_model: Callable[[], nn.Module],
        metrics: Any = None,  # FedMetrics
        patience_s: float = 300.0,
        faults: dict[str, str] | None = None,  # test hooks: client id -> one of hooks.ALL (faults.py)
        log: Callable[[str], None] = lambda s: print(s, flush=True),
    ):
        self.spec = spec
        self.fed = spec.federated
        self.stub = pbg.FederatedStub(channel)
        # A pod holds only its own clients' credentials; in-process runs and tests pass the server key.
        self.creds = key if isinstance(key, auth.Credentials) else auth.Credentials.derive(key, [c.cid for c in clients])
        self.session = ""  # the aggregator process's, learnt from Join
        self.heard = 0  # the highest round heard of in this session
        self._bound: dict[str, str] = {}  # client id -> the round attempt of its current task
        self.clients = clients
        self.make_model = make_model
        self.metrics = metrics
        self.patience_s = patience_s
        self.faults = faults or {}
        unknown = set(self.faults.values()) - set(hooks.ALL)
        if unknown:
            raise ValueError(f"unknown fault hooks {sorted(unknown)}; known: {', '.join(hooks.ALL)}")
        self.log = log
        self._train_lock = asyncio.Lock()
        self._models: list[nn.Module] = []
        self.pushed: dict[str, int] = {}
        self.final_summary: dict[str, Any] | None = None  # sent by the aggregator with "done"

    def md(self, cid: str, binding: str | None = None) -> tuple[tuple[str, str], ...]:
        """A call's metadata for `cid`: a token bound to this session and, unless `binding` names
        another, to the round attempt of the client's current task."""
        if binding == JOIN:
            return self.creds.metadata(cid, "", JOIN)
        return self.creds.metadata(cid, self.session, self._bound.get(cid, "") if binding is None else binding)

    def fault_point(self, cid: str, stage: str) -> None:
        """A drop hook for this client at this stage: stop talking for good (see faults.py)."""
        if self.faults.get(cid) == stage:
            raise hooks.Dropped(stage)

    async def join(self, cid: str) -> pb.JoinReply:
        reply = await self.retry(f"{cid} Join", lambda: self.stub.Join(pb.JoinRequest(client_ids=[cid]),
                                                                      metadata=self.md(cid, JOIN)))  # fmt: skip
        if reply.session != self.session:  # a new aggregator process: its rounds are what it says
            self.session, self.heard = reply.session, int(reply.round)
        else:
            self.heard = max(self.heard, int(reply.round))
        return reply

    async def retry(self, what: str, call: Callable[[], Awaitable[T]], *, rejoin: str | None = None) -> T:
        """`call` until it succeeds, backing off on a lost connection; with `rejoin` (a client id),
        a token refused for a passed session or round has that client join again first."""
        delay, start = BACKOFF_FIRST_S, time.monotonic()
        rejoins = 0
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as e:
                if rejoin is not None and refusal_of(e) in auth.EXPIRED and rejoins < MAX_REJOINS:
                    rejoins += 1
                    await self.join(rejoin)
                    continue
                if e.code() not in RETRYABLE:
                    raise
                why = f"{e.code().name}: {e.details()}"
            except codec.StreamError as e:
                # A model stream that ended early without an error status: the aggregator went away
                # mid-stream. (The client trusts its aggregator's bytes; see MAX_MODEL_BYTES.)
                why = f"{e.reason}: {e}"
            if time.monotonic() - start > self.patience_s:
                raise Disconnected(f"{what}: aggregator unreachable for {self.patience_s:.0f} s: {why}")
            self.log(f"{what}: {why}; retrying in {delay:.1f} s")
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    async def run(self) -> None:
        await asyncio.gather(*(self._client_loop(c) for c in self.clients))

    async def _get_task(self, cid: str) -> tuple[codec.Received, float]:
        """The task and the seconds its bytes took (waiting to be sampled is idle, not communication)."""

        async def call() -> tuple[codec.Received, float]:
            stream = self.stub.GetTask(pb.TaskRequest(client_id=cid), metadata=self.md(cid, wait_binding(self.heard)))
            d = codec.Decoder(max_bytes=MAX_MODEL_BYTES)
            first: float | None = None
            async for chunk in stream:
                first = first if first is not None else time.perf_counter()
                d.feed(chunk)
            return d.finish(), time.perf_counter() - (first or time.perf_counter())

        task, seconds = await self.retry(f"{cid} GetTask", call, rejoin=cid)
        if task.header.kind == "train":  # the client's calls of this round carry its round attempt
            self.heard = max(self.heard, int(task.header.round))
            self._bound[cid] = round_binding(int(task.header.round), int(task.header.scalars["attempt"]))
        return task, seconds

    async def _client_loop(self, st: ClientState) -> None:
        try:
            await self._rounds(st)
        except hooks.Dropped as e:
            self.log(f"{st.cid}: test fault: stopped talking at {e}")

    async def _rounds(self, st: ClientState) -> None:
        cid = st.cid
        await self.join(cid)
        comm_carry = 0.0  # the previous upload, charged to the next round's report
        while True:
            task, t_recv = await self._get_task(cid)
            if task.header.kind == "done":
                if "summary" in task.header.attrs:
                    self.final_summary = json.loads(task.header.attrs["summary"])
                return
            round_no = task.header.round
            attempt = int(task.header.scalars["attempt"])
            global_state = {n: t.clone() for n, t in task.tensors}
            if self.metrics is not None:
                self.metrics.bytes_down.inc(task.wire_bytes)
            sec = None
            if self.fed.secure_aggregation:
                sec = await secure_client.setup(self, cid, round_no, attempt)
                if sec is None:
                    continue  # the round was aborted; ask for work again
            async with self._train_lock:
                model = self._models.pop() if self._models else self.make_model()
                try:
                    full = {**dict(model.state_dict()), **global_state}
                    res = await asyncio.to_thread(
                        train_local, model, full, st, self.spec, round_no=round_no, fault=self.faults.get(cid)
                    )
                finally:
                    self._models.append(model)
            t1 = time.perf_counter()
            scalars = {"attempt": attempt, "num_samples": res.num_samples, "compute_s": res.compute_s,
                       "data_s": res.data_s, "loss": res.loss, "comm_s": comm_carry + t_recv}  # fmt: skip
            if sec is not None:
                reply = await secure_client.push_masked(self, sec, res, scalars)
            else:
                wire, extra = compression.encode(
                    self.fed.compression, res.update, topk_ratio=self.fed.topk_ratio, residual=st.residual
                )
                header = codec.make_header(kind="update", round=round_no, tensors=wire, scalars={**scalars, **extra})
                # Retried like every call: an aggregator that dies while this update is on the wire
                # comes back from its checkpoint and refuses the stale round, and the loop goes on.
                reply = await self.retry(
                    f"{cid} PushUpdate",
                    lambda header=header, wire=wire: self.stub.PushUpdate(iter(codec.encode(header, wire)),
                                                                     metadata=self.md(cid)),
                )
                if self.metrics is not None:
                    self.metrics.bytes_up.inc(header.ByteSize() + sum(t.numel() * t.element_size() for _, t in wire))
            comm_carry = time.perf_counter() - t1
            if not reply.accepted and reply.reason.startswith("duplicate"):
                # A retried push whose first try had arrived: the aggregator holds this update.
                reply = pb.PushReply(accepted=True)
            if not reply.accepted:
                self.log(f"{cid}: round {round_no}: update refused: {reply.reason}")
            else:
                self.pushed[cid] = self.pushed.get(cid, 0) + 1
            if sec is not None and reply.accepted:
                await secure_client.reveal(self, sec)
            if self.metrics is not None:
                self.metrics.client_times(cid, res.compute_s, comm_carry)
                self.metrics.write({"event": "client_round", "client": cid, "round": round_no,
                                    "compute_s": res.compute_s, "data_s": res.data_s, "loss": res.loss,
                                    "accepted": reply.accepted})  # fmt: skip


def refusal_of(e: grpc.aio.AioRpcError) -> str:
    """The reason label a refused call carries in its trailing metadata ("" when none)."""
    for k, v in e.trailing_metadata() or ():
        if k == auth.REFUSAL_KEY:
            return v if isinstance(v, str) else v.decode()
    return ""
