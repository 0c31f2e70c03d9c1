"""The gate every call to a transport service passes: token, then session and binding, then rate.

A service (the federated aggregator, a parameter-server shard) supplies its keyring,
its limits and `authorize(method, claim)`: whether the claimed session and binding
are current for that method. Refusals are counted by reason (the service's
rejection counter) and logged, at most once a second per reason, so a flood of
bad calls cannot flood the log.

Two ways out for a refused call: a hard refusal ends it with UNAUTHENTICATED or
RESOURCE_EXHAUSTED (the reason in the trailing metadata `x-disttrain-refusal`); an
authentic call whose session or round has passed gets, for methods that have one,
the method's own "refused" reply (an update from a closed round is a straggler's as
often as a replay's, and the caller goes on as it always did with a stale round).
`AioGuard` applies the gate to a grpc.aio server as an interceptor and hands the
verified identity to the handler (`verified_identity()`); blocking servers call
`Gate.admit` themselves.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from . import auth
from .limits import BUSY, RATE_LIMITED, STREAM_TOO_LARGE, Admission, Limits

Authorize = Callable[[str, auth.Claim], auth.Refusal | None]
_VERIFIED: contextvars.ContextVar[str | None] = contextvars.ContextVar("disttrain_verified_identity", default=None)
LOG_EVERY_S = 1.0


def verified_identity() -> str | None:
    """The identity the gate verified for the call being handled (None outside a guarded call)."""
    return _VERIFIED.get()


def status_for(reason: str) -> grpc.StatusCode:
    if reason in (RATE_LIMITED, BUSY, STREAM_TOO_LARGE):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAUTHENTICATED


@dataclass
class Gate:
    keyring: auth.Keyring
    limits: Limits
    authorize: Authorize
    count: Callable[[str], None]  # the service's rejection counter, by reason
    log: Callable[[str], None]
    service: str = "server"
    admission: Admission = field(init=False)
    _logged: dict[str, float] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.limits)

    def refuse(self, who: str, refusal: auth.Refusal) -> None:
        self.count(refusal.reason)
        with self._lock:
            now = time.monotonic()
            quiet = now - self._logged.get(refusal.reason, -LOG_EVERY_S) < LOG_EVERY_S
            if not quiet:
                self._logged[refusal.reason] = now
        if not quiet:
            self.log(f"{self.service}: refused {who}: {refusal.details()}")

    def admit(self, method: str, metadata: Sequence[tuple[str, Any]] | None, peer: str
              ) -> tuple[auth.Claim | None, auth.Refusal | None]:  # fmt: skip
        """(claim, None): verified, go on, and `admission.leave(claim.identity)` when the call ends.
        (claim, refusal): authentic but its session or binding has passed (a soft refusal is possible).
        (None, refusal): refused. Every refusal is counted here."""
        claim = auth.claim_of(metadata)
        if isinstance(claim, auth.Refusal):
            self.refuse(peer, claim)
            return None, claim
        bad = self.keyring.verify(claim)
        if bad is not None:
            self.refuse(f"{peer} ({claim.identity}?)", bad)
            return None, bad
        bad = self.authorize(method, claim)
        if bad is not None:
            self.refuse(claim.identity, bad)
            return (claim if bad.reason in auth.EXPIRED else None), bad
        why = self.admission.enter(claim.identity)
        if why is not None:
            bad = auth.Refusal(why, f"{method}: over {self.limits.calls_per_s:g} calls/s (burst {self.limits.burst})"
                               if why == RATE_LIMITED else f"{method}: {self.limits.max_calls_in_flight} calls "
                               "already in flight")  # fmt: skip
            self.refuse(claim.identity, bad)
            return None, bad
        return claim, None

    def stream_refusal(self, method: str, identity: str, sent: int, messages: int) -> auth.Refusal | None:
        """A refusal (counted) once a request stream has passed its bytes or messages."""
        lim = self.limits
        if sent <= lim.max_stream_bytes and messages <= lim.max_stream_messages:
            return None
        bad = auth.Refusal(STREAM_TOO_LARGE, f"{method}: the request stream passed {lim.max_stream_bytes} bytes or "
                                             f"{lim.max_stream_messages} messages ({sent} bytes in {messages})")  # fmt: skip
        self.refuse(identity, bad)
        return bad


def trailer(refusal: auth.Refusal) -> tuple[tuple[str, str], ...]:
    """The refusal's reason; a stream too long is not to be sent again (gRPC's retry pushback)."""
    if refusal.reason == STREAM_TOO_LARGE:
        return ((auth.REFUSAL_KEY, refusal.reason), ("grpc-retry-pushback-ms", "-1"))
    return ((auth.REFUSAL_KEY, refusal.reason),)


class AioGuard(grpc.aio.ServerInterceptor):
    """`gate` on every call of a grpc.aio server; `soft` maps a method to the reply it gives an
    authentic call whose session or round has passed; `size` measures a streamed request message."""

    def __init__(self, gate: Gate, *, soft: Mapping[str, Callable[[auth.Refusal], Any]] | None = None,
                 size: Callable[[Any], int] = len):  # fmt: skip
        self.gate = gate
        self.soft = dict(soft or {})
        self.size = size

    async def _enter(self, method: str, context: grpc.aio.ServicerContext) -> tuple[str | None, Any]:
        claim, refusal = self.gate.admit(method, context.invocation_metadata(), context.peer())
        if claim is not None and refusal is None:
            _VERIFIED.set(claim.identity)
            return claim.identity, None
        assert refusal is not None
        if claim is not None and method in self.soft:
            return None, self.soft[method](refusal)
        await context.abort(status_for(refusal.reason), refusal.details(), trailing_metadata=trailer(refusal))
        raise AssertionError("abort returns only by raising")  # pragma: no cover

    async def _limited(self, method: str, identity: str, requests: AsyncIterator[Any],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # fmt: skip
        sent = count = 0
        async for message in requests:
            sent += self.size(message)
            count += 1
            bad = self.gate.stream_refusal(method, identity, sent, count)
            if bad is not None:
                await context.abort(status_for(bad.reason), bad.details(), trailing_metadata=trailer(bad))
            yield message

    async def intercept_service(self, continuation, details):  # noqa: ANN001, ANN201 - grpc's signature
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        guard = self

        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                identity, soft = await guard._enter(method, context)
                if identity is None:
                    return soft
                try:
                    return await inner_uu(request, context)
                finally:
                    guard.gate.admission.leave(identity)

            return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=handler.request_deserializer,
                                                       response_serializer=handler.response_serializer)  # fmt: skip
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                identity, soft = await guard._enter(method, context)
                if identity is None:
                    yield soft
                    return
                try:
                    async for reply in inner_us(request, context):
                        yield reply
                finally:
                    guard.gate.admission.leave(identity)

            return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=handler.request_deserializer,
                                                        response_serializer=handler.response_serializer)  # fmt: skip
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                identity, soft = await guard._enter(method, context)
                if identity is None:
                    return soft
                try:
                    return await inner_su(guard._limited(method, identity, requests, context), context)
                finally:
                    guard.gate.admission.leave(identity)

            return grpc.stream_unary_rpc_method_handler(stream_unary, request_deserializer=handler.request_deserializer,
                                                        response_serializer=handler.response_serializer)  # fmt: skip
        raise TypeError(f"{details.method}: bidirectional streams are not part of the transport")
