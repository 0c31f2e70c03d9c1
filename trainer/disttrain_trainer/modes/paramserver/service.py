"""The parameter-server gRPC service on the shared chunked-tensor transport.

Three methods, all carrying the transport's own messages (`Chunk` streams with a
`StreamHeader` on the first chunk, `PushReply`), so tensors travel as raw bytes in
the same chunks the federated mode uses:

  Hello(Chunk) -> Chunk         kind "hello"; reply attrs incarnation (the session every
                                later token is bound to), scalars workerSteps
  Pull(Chunk) -> stream Chunk   request header: kind "pull", round = the version the
                                worker holds, attrs incarnation; reply header:
                                kind "params", round = the shard's version, scalars
                                (workerSteps, done, ...), and only the tensors changed
                                since the worker's version (all of them when it holds
                                none, or a version of another server incarnation)
  Push(stream Chunk) -> PushReply   header: kind "grad", round = the version the
                                gradient was computed on, attrs incarnation, scalars
                                (loss, worker timings); the reply's sequence is the
                                worker's pushes counted so far

Every call carries a token made with the worker's own credential (tensor_transport/
auth.py), bound to the shard's incarnation and, for Pull and Push, to the worker's
push count: a Push replayed after the one it was made for counted is refused
(server.py says which bindings each method takes). The worker's id is the one its
token proves, never a header field.

The methods are registered with generic handlers under one service name: the
messages are the transport's, so no second .proto (and no second set of stubs)
is needed. The streamed side travels as raw frames (`tensor_transport.frames`:
serialised `Chunk`s built and read without protobuf objects), so a tensor's
bytes are copied once on each side beyond what gRPC itself does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import grpc
import torch

from ...tensor_transport import auth, codec, frames
from ...tensor_transport.channel import Tls, channel
from ...tensor_transport.protos import tensor_transport_pb2 as pb

SERVICE = "disttrain.paramserver.v1.ParamServer"
HELLO = f"/{SERVICE}/Hello"
PULL = f"/{SERVICE}/Pull"
PUSH = f"/{SERVICE}/Push"
KIND_HELLO, KIND_PULL, KIND_PARAMS, KIND_GRAD = "hello", "pull", "params", "grad"
ATTR_INCARNATION = "incarnation"
BIND_HELLO = "hello"  # Hello's binding, with no session; Pull and Push: the worker's push count
# Hellos in a row one call may ask for (its token named a passed incarnation or count).
MAX_REHELLOS = 5


def handler(
    hello: Callable[[pb.Chunk, grpc.ServicerContext], pb.Chunk],
    pull: Callable[[pb.Chunk, grpc.ServicerContext], Iterator[bytes]],
    push: Callable[[Iterator[bytes], grpc.ServicerContext], pb.PushReply],
) -> grpc.GenericRpcHandler:
    """Pull yields frames, Push consumes frames (no (de)serialiser: gRPC passes the bytes)."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Hello": grpc.unary_unary_rpc_method_handler(hello, request_deserializer=pb.Chunk.FromString,
                                                         response_serializer=pb.Chunk.SerializeToString),
            "Pull": grpc.unary_stream_rpc_method_handler(pull, request_deserializer=pb.Chunk.FromString),
            "Push": grpc.stream_unary_rpc_method_handler(push, response_serializer=pb.PushReply.SerializeToString),
        },
    )


@dataclass(frozen=True, kw_only=True)
class Pulled:
    version: int
    incarnation: str
    tensors: list[tuple[str, torch.Tensor]]
    scalars: dict[str, float]
    wire_bytes: int


@dataclass(frozen=True, kw_only=True)
class Pushed:
    accepted: bool
    reason: str
    wire_bytes: int


def refusal_of(e: grpc.RpcError) -> str:
    """The reason label a refused call carries in its trailing metadata ("" when none)."""
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for k, v in trailing or ():
        if k == auth.REFUSAL_KEY:
            return v if isinstance(v, str) else v.decode()
    return ""


class ShardClient:
    """A worker's blocking stub for one shard; it keeps the session (the shard's incarnation) and
    each worker's push count that its tokens are bound to, and says hello again when they pass."""

    def __init__(self, address: str, *, max_bytes: int, creds: auth.Credentials, tls: Tls | None = None,
                 server_name: str | None = None):  # fmt: skip
        self.address = address
        self.max_bytes = max_bytes  # the shard's tensors: a reply larger than that is refused
        self.creds = creds
        self.channel = channel(address, tls, server_name)
        self.session = ""  # the shard's incarnation, from Hello
        self.sequence: dict[str, int] = {}  # worker -> its pushes the shard has counted
        self._hello = self.channel.unary_unary(HELLO, request_serializer=pb.Chunk.SerializeToString,
                                               response_deserializer=pb.Chunk.FromString)  # fmt: skip
        self._pull = self.channel.unary_stream(PULL, request_serializer=pb.Chunk.SerializeToString)
        self._push = self.channel.stream_unary(PUSH, response_deserializer=pb.PushReply.FromString)

    def hello(self, worker: str, timeout: float | None = None) -> None:
        header = codec.make_header(kind=KIND_HELLO, round=0, tensors=())
        reply = self._hello(pb.Chunk(header=header), timeout=timeout,
                            metadata=self.creds.metadata(worker, "", BIND_HELLO))  # fmt: skip
        self.session = reply.header.attrs.get(ATTR_INCARNATION, "")
        self.sequence[worker] = int(reply.header.scalars.get("workerSteps", 0.0))

    def _md(self, worker: str, timeout: float | None) -> tuple[tuple[str, str], ...]:
        if not self.session or worker not in self.sequence:
            self.hello(worker, timeout)
        return self.creds.metadata(worker, self.session, str(self.sequence[worker]))

    def pull(self, *, worker: str, version: int, incarnation: str, timeout: float | None = None,
             into: Mapping[str, torch.Tensor] | None = None) -> Pulled:  # fmt: skip
        """The shard's changed tensors; with `into`, written straight into those tensors."""
        header = codec.make_header(kind=KIND_PULL, round=version, tensors=(), attrs={ATTR_INCARNATION: incarnation})
        for attempt in range(MAX_REHELLOS + 1):
            try:
                frames_in = self._pull(pb.Chunk(header=header), timeout=timeout, metadata=self._md(worker, timeout))
                got = frames.decode_all(frames_in, self.max_bytes, into)
                break
            except grpc.RpcError as e:
                if refusal_of(e) not in auth.EXPIRED or attempt == MAX_REHELLOS:
                    raise
                self.hello(worker, timeout)  # a restarted shard, or a count that moved: learn them anew
        self.sequence[worker] = int(got.header.scalars.get("workerSteps", 0.0))
        return Pulled(
            version=got.header.round, incarnation=got.header.attrs.get(ATTR_INCARNATION, ""),
            tensors=got.tensors, scalars=dict(got.header.scalars), wire_bytes=got.wire_bytes,
        )  # fmt: skip

    def push(
        self,
        *,
        worker: str,
        version: int,
        incarnation: str,
        grads: list[tuple[str, torch.Tensor]],
        scalars: Mapping[str, float] | None = None,
        timeout: float | None = None,
    ) -> Pushed:
        header = codec.make_header(kind=KIND_GRAD, round=version, tensors=grads, scalars=scalars,
                                   attrs={ATTR_INCARNATION: incarnation})  # fmt: skip
        md = self._md(worker, timeout)
        sent = 0

        def chunks() -> Iterable[bytes]:
            nonlocal sent
            for f in frames.encode(header, grads):
                sent += len(f)
                yield f

        reply = self._push(iter(chunks()), timeout=timeout, metadata=md)
        self.sequence[worker] = int(reply.sequence)
        return Pushed(accepted=reply.accepted, reason=reply.reason, wire_bytes=sent)

    def close(self) -> None:
        self.channel.close()
