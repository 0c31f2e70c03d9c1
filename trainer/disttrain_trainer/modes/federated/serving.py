"""The aggregator's gRPC server: its limits, and what each method's token must be bound to.

Bindings (the `x-disttrain-binding` a client's token is made for, see tensor_transport/auth.py):
  Join            "join", no session: the bootstrap call; it tells the client the session and
                  the rounds completed, nothing a replay could use
  GetTask         "wait:<r>", r = the highest round the client has heard of in this session;
                  refused once round r+1 has completed (the client joins again and retries)
  PushUpdate and  "<round>.<attempt>" of the task the client was sent: accepted only while that
  the secure      attempt is the aggregator's current one; a token of an earlier round or of
  stages          another aggregator process gets the method's "refused" reply and is counted
"""

from __future__ import annotations

import grpc

from ...tensor_transport import auth, gate
from ...tensor_transport.channel import server_options
from ...tensor_transport.limits import Limits, federated_limits
from ...tensor_transport.protos import tensor_transport_pb2 as pb
from ...tensor_transport.protos import tensor_transport_pb2_grpc as pbg
from . import compression
from .aggregator import Aggregator
from .bindings import JOIN, WAIT

ROUND_METHODS = ("PushUpdate", "AdvertiseKeys", "ShareKeys", "Unmask", "RevealShares")
WRONG_BINDING = auth.WRONG_BINDING

# What an authentic call whose round or session has passed gets instead of an error: the reply
# a stale call got before tokens were bound to rounds, so clients go on exactly as they did.
SOFT_REPLIES = {
    "PushUpdate": lambda r: pb.PushReply(accepted=False, reason=r.details()),
    "AdvertiseKeys": lambda r: pb.KeyBook(aborted=True),
    "ShareKeys": lambda r: pb.ShareBundle(aborted=True),
    "Unmask": lambda r: pb.UnmaskPlan(aborted=True),
    "RevealShares": lambda r: pb.PushReply(accepted=False, reason=r.details()),
}


def authorize(agg: Aggregator, method: str, claim: auth.Claim) -> auth.Refusal | None:
    """Whether an authentic token's session and binding are current for `method`."""
    b = claim.binding
    if method == "Join":
        if b != JOIN or claim.session:
            return auth.Refusal(WRONG_BINDING, f"Join takes a token bound to {JOIN!r}, not {b!r}")
        return None
    if method == "GetTask":
        if not b.startswith(WAIT) or not b[len(WAIT) :].isdigit():
            return auth.Refusal(WRONG_BINDING, f"GetTask takes a token bound to '{WAIT}<round>', not {b!r}")
    elif method in ROUND_METHODS:
        r, _, a = b.partition(".")
        if not (r.isdigit() and a.isdigit()):
            return auth.Refusal(WRONG_BINDING, f"{method} takes a token bound to '<round>.<attempt>', not {b!r}")
    else:
        return auth.Refusal(WRONG_BINDING, f"no binding is accepted for {method}")
    if claim.session != agg.session:
        return auth.Refusal(auth.EXPIRED_SESSION, f"{method}: the token is bound to session {claim.session!r}, "
                                                  "not this aggregator's: join again")  # fmt: skip
    if method == "GetTask":
        heard = int(b[len(WAIT) :])
        if heard < agg.round:
            return auth.Refusal(auth.EXPIRED_ROUND, f"GetTask: the token was made after round {heard}; "
                                                    f"{agg.round} rounds are complete: join again")  # fmt: skip
        return None
    ra = agg.current
    if ra is None or b != ra.round_id:
        now = ra.round_id if ra is not None else "none"
        return auth.Refusal(auth.EXPIRED_ROUND, f"{method}: the token is bound to round {b}, the round now is {now}")
    return None


def limits_for(agg: Aggregator) -> Limits:
    masked = (agg.numel + 1) * 8
    plain = compression.wire_limit(agg.fed.compression, agg.shapes)
    return federated_limits(clients=agg.fed.clients, update_bytes=max(masked, plain))


def build_gate(agg: Aggregator, limits: Limits | None = None) -> gate.Gate:
    return gate.Gate(keyring=agg.keyring, limits=limits or limits_for(agg), authorize=lambda m, c: authorize(agg, m, c),
                     count=agg.metrics.reject, log=agg.log, service="aggregator")  # fmt: skip


def build_server(agg: Aggregator, limits: Limits | None = None, g: gate.Gate | None = None) -> grpc.aio.Server:
    """The aggregator's servicer behind the gate, with its limits (logged once)."""
    g = g or build_gate(agg, limits)
    limits = g.limits
    guard = gate.AioGuard(g, soft=SOFT_REPLIES, size=lambda chunk: chunk.ByteSize())
    server = grpc.aio.server(interceptors=[guard], options=server_options(limits),
                             maximum_concurrent_rpcs=limits.max_concurrent_rpcs)  # fmt: skip
    pbg.add_FederatedServicer_to_server(agg, server)
    agg.log(f"aggregator: limits: {limits.describe()}")
    return server

