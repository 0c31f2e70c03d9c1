"""The parameter-server gRPC service on the shared chunked-tensor transport.

Two methods, both carrying the transport's own messages (`Chunk` streams with a
`StreamHeader` on the first chunk, `PushReply`), so tensors travel as raw bytes in
the same chunks the federated mode uses:

  Pull(Chunk) -> stream Chunk   request header: kind "pull", round = the version the
                                worker holds, attrs worker + incarnation; reply header:
                                kind "params", round = the shard's version, scalars
                                (workerSteps, done, ...), and only the tensors changed
                                since the worker's version (all of them when it holds
                                none, or a version of another server incarnation)
  Push(stream Chunk) -> PushReply   header: kind "grad", round = the version the
                                gradient was computed on, attrs worker + incarnation,
                                scalars (loss, worker timings)

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

from ..tensor_transport import codec, frames
from ..tensor_transport.channel import OPTIONS
from ..tensor_transport.protos import tensor_transport_pb2 as pb

SERVICE = "disttrain.paramserver.v1.ParamServer"
PULL = f"/{SERVICE}/Pull"
PUSH = f"/{SERVICE}/Push"
KIND_PULL, KIND_PARAMS, KIND_GRAD = "pull", "params", "grad"
ATTR_WORKER, ATTR_INCARNATION = "worker", "incarnation"


def handler(
    pull: Callable[[pb.Chunk, grpc.ServicerContext], Iterator[bytes]],
    push: Callable[[Iterator[bytes], grpc.ServicerContext], pb.PushReply],
) -> grpc.GenericRpcHandler:
    """Pull yields frames, Push consumes frames (no (de)serialiser: gRPC passes the bytes)."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
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


class ShardClient:
    """One worker's blocking stub for one shard."""

    def __init__(self, address: str, *, max_bytes: int):
        self.address = address
        self.max_bytes = max_bytes  # the shard's tensors: a reply larger than that is refused
        self.channel = grpc.insecure_channel(address, options=OPTIONS)
        self._pull = self.channel.unary_stream(PULL, request_serializer=pb.Chunk.SerializeToString)
        self._push = self.channel.stream_unary(PUSH, response_deserializer=pb.PushReply.FromString)

    def pull(self, *, worker: str, version: int, incarnation: str, timeout: float | None = None,
             into: Mapping[str, torch.Tensor] | None = None) -> Pulled:  # fmt: skip
        """The shard's changed tensors; with `into`, written straight into those tensors."""
        header = codec.make_header(
            kind=KIND_PULL, round=version, tensors=(), attrs={ATTR_WORKER: worker, ATTR_INCARNATION: incarnation}
        )
        got = frames.decode_all(self._pull(pb.Chunk(header=header), timeout=timeout), self.max_bytes, into)
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
        header = codec.make_header(
            kind=KIND_GRAD, round=version, tensors=grads, scalars=scalars,
            attrs={ATTR_WORKER: worker, ATTR_INCARNATION: incarnation},
        )  # fmt: skip
        sent = 0

        def chunks() -> Iterable[bytes]:
            nonlocal sent
            for f in frames.encode(header, grads):
                sent += len(f)
                yield f

        reply = self._push(iter(chunks()), timeout=timeout)
        return Pushed(accepted=reply.accepted, reason=reply.reason, wire_bytes=sent)

    def close(self) -> None:
        self.channel.close()
