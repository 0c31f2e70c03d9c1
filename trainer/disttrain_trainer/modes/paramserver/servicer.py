"""The gRPC side of a parameter-server shard: every call through the gate, then the Shard.

Each call carries a token made with the calling worker's own credential
(tensor_transport/auth.py), bound to this shard's incarnation and, for Pull and
Push, to the worker's push count (`authorize`): one worker cannot push or pull as
another, and a captured push cannot be replayed once it was counted.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import torch

from ...tensor_transport import auth, codec, frames
from ...tensor_transport.gate import Gate, status_for, trailer
from ...tensor_transport.protos import tensor_transport_pb2 as pb
from . import service
from .server import Shard, Verdict


def authorize(shard: Shard, method: str, claim: auth.Claim) -> auth.Refusal | None:
    """Hello: bound to "hello", no session (it tells the worker both). Pull: this incarnation and
    the worker's push count (or one less: a push whose reply was lost). Push: this incarnation
    and exactly the count, so a push is accepted once."""
    b = claim.binding
    if method == "Hello":
        if b != service.BIND_HELLO or claim.session:
            return auth.Refusal(auth.WRONG_BINDING, f"Hello takes a token bound to {service.BIND_HELLO!r}, not {b!r}")
        return None
    if method not in ("Pull", "Push") or not b.isdigit():
        return auth.Refusal(auth.WRONG_BINDING, f"{method} takes a token bound to a push count, not {b!r}")
    if claim.session != shard.incarnation:
        return auth.Refusal(auth.EXPIRED_SESSION, f"{method}: the token is bound to incarnation {claim.session!r}, "
                                                  f"this shard is {shard.incarnation}: say hello again")  # fmt: skip
    seq, steps = int(b), shard.worker_steps.get(claim.identity, 0)
    if (method == "Push" and seq != steps) or not steps - 1 <= seq <= steps:
        return auth.Refusal(auth.EXPIRED_ROUND, f"{method}: the token is bound to push {seq}, "
                                                f"{claim.identity} has {steps} counted")  # fmt: skip
    return None


class Servicer:
    """The gRPC side of a shard: admit through the gate, decode, hand to the Shard, answer."""

    def __init__(self, shard: Shard, gate: Gate):
        self.shard = shard
        self.gate = gate

    def _admit(self, method: str, context: grpc.ServicerContext) -> tuple[auth.Claim | None, auth.Refusal | None]:
        claim, refusal = self.gate.admit(method, context.invocation_metadata(), context.peer())
        if refusal is not None and (claim is None or method != "Push"):  # only Push has a soft reply
            context.set_trailing_metadata(trailer(refusal))
            context.abort(status_for(refusal.reason), refusal.details())
        return claim, refusal

    def hello(self, request: pb.Chunk, context: grpc.ServicerContext) -> pb.Chunk:
        claim, _ = self._admit("Hello", context)
        assert claim is not None
        try:
            steps = float(self.shard.worker_steps.get(claim.identity, 0))
            header = codec.make_header(kind=service.KIND_HELLO, round=self.shard.version, tensors=(),
                                       scalars={"workerSteps": steps},
                                       attrs={service.ATTR_INCARNATION: self.shard.incarnation})  # fmt: skip
            return pb.Chunk(header=header)
        finally:
            self.gate.admission.leave(claim.identity)

    def pull(self, request: pb.Chunk, context: grpc.ServicerContext) -> Iterator[bytes]:
        claim, _ = self._admit("Pull", context)
        assert claim is not None
        try:
            h = request.header
            header, tensors, generation = self.shard.snapshot(
                worker=claim.identity, version=h.round, incarnation=h.attrs.get(service.ATTR_INCARNATION, ""),
            )  # fmt: skip
            sent = 0
            try:
                for f in frames.encode(header, tensors):  # copied frame by frame as gRPC sends
                    sent += len(f)
                    yield f
            finally:
                self.shard.release(generation)
                self.shard.metrics.pull_bytes.inc(sent)
        finally:
            self.gate.admission.leave(claim.identity)

    def push(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> pb.PushReply:
        claim, refusal = self._admit("Push", context)
        assert claim is not None
        if refusal is not None:  # authentic, but for another incarnation or push: a replay, or a restart
            return pb.PushReply(accepted=False, reason=refusal.details(),
                                sequence=self.shard.worker_steps.get(claim.identity, 0))  # fmt: skip
        buf = self.shard.take_buffer()
        try:
            frames_in = self._limited(request_iterator, claim.identity, context)
            reply = self._push(frames_in, buf, claim)
            reply.sequence = self.shard.worker_steps.get(claim.identity, 0)
            return reply
        finally:
            self.shard.give_buffer(buf)
            self.gate.admission.leave(claim.identity)

    def _limited(self, frames_in: Iterator[bytes], identity: str, context: grpc.ServicerContext) -> Iterator[bytes]:
        sent = count = 0
        for f in frames_in:
            sent += len(f)
            count += 1
            bad = self.gate.stream_refusal("Push", identity, sent, count)
            if bad is not None:
                context.set_trailing_metadata(trailer(bad))
                context.abort(status_for(bad.reason), bad.details())
            yield f

    def _push(self, request_iterator: Iterator[bytes], buf: dict[str, torch.Tensor], claim: auth.Claim) -> pb.PushReply:
        try:
            # Names, dtypes and shapes are checked against the buffers before a byte is written.
            got = frames.decode_all(request_iterator, self.shard.nbytes, into=buf)
        except codec.StreamError as e:
            v = self.shard.reject(Verdict(accepted=False, reason=e.reason, message=str(e)))
            return pb.PushReply(accepted=False, reason=f"{v.reason}: {v.message}")
        self.shard.metrics.push_bytes.inc(got.wire_bytes)
        h = got.header
        if h.kind != service.KIND_GRAD:
            v = self.shard.reject(Verdict(accepted=False, reason="bad_kind", message=f"header kind {h.kind!r}"))
            return pb.PushReply(accepted=False, reason=f"{v.reason}: {v.message}")
        v = self.shard.push(worker=claim.identity, version=h.round, incarnation=h.attrs.get(service.ATTR_INCARNATION, ""),
                            tensors=got.tensors, sequence=int(claim.binding))  # fmt: skip
        return pb.PushReply(accepted=v.accepted, reason=f"{v.reason}: {v.message}" if v.reason else "")
