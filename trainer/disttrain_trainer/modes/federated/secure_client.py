"""The client's side of secure aggregation (Bonawitz et al. 2017): keys, shares, masked input, reveal.

See secagg.py for the protocol. The aggregator only relays: shares are sealed
for their recipient, and a client reveals, per peer, either the share of its
self-mask seed (peer survived) or of its mask key (peer dropped), never both.

The masked input runs over U2, the clients whose shares the aggregator
received, which its ShareKeys reply names. A client checks that set before it
masks anything: it must be in it, the set must reach the threshold, and the
client must hold a share from every member (a member it holds none from could
never have its masks rebuilt were it to drop). It checks the unmask plan the
same way: survivors and dropped must split U2 exactly.

Every call goes through the runner's retry with backoff: a call cut by an
aggregator restart is repeated, and the restarted aggregator answers a stage of
a round it no longer plays with `aborted` or `stale`, so the client gives up
that round and asks for work again.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from disttrain_api.model import FederatedSpec

from ...tensor_transport import codec
from ...tensor_transport.protos import tensor_transport_pb2 as pb
from . import faults, secagg
from .local_training import LocalResult

T = TypeVar("T")


class Runner(Protocol):
    """What the secure stages use of the client's runner (client.ClientRunner): its stub, its
    per-call metadata, its retry with backoff, its fault hooks and its log."""

    fed: FederatedSpec
    stub: Any  # the Federated service's stub
    faults: dict[str, str]

    def md(self, cid: str, binding: str | None = None) -> tuple[tuple[str, str], ...]: ...

    def fault_point(self, cid: str, stage: str) -> None: ...

    def log(self, line: str) -> None: ...

    async def retry(self, what: str, call: Callable[[], Awaitable[T]], *, rejoin: str | None = None) -> T: ...


@dataclass
class SecureRound:
    cid: str
    round: int
    attempt: int
    cipher: secagg.KeyPair
    mask: secagg.KeyPair
    self_seed: bytes
    book: dict[str, pb.PublicKeys]  # U1
    threshold: int
    # owner -> (x, share of owner's self seed, share of owner's mask key), from the owner's sealed bundle
    held: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    sharers: list[str] = field(default_factory=list)  # U2, as the aggregator's ShareKeys reply names it

    @property
    def round_id(self) -> str:
        return f"{self.round}.{self.attempt}"


async def setup(runner: Runner, cid: str, round_no: int, attempt: int) -> SecureRound | None:
    """Advertise keys, share secrets; None when the round was aborted or its sets are refused."""
    cipher, mask = secagg.KeyPair.generate(), secagg.KeyPair.generate()
    ad = pb.PublicKeys(client_id=cid, round=round_no, cipher_pk=cipher.public_bytes(), mask_pk=mask.public_bytes())
    book = await runner.retry(f"{cid} AdvertiseKeys", lambda: runner.stub.AdvertiseKeys(ad, metadata=runner.md(cid)))
    if book.aborted:
        return None
    runner.fault_point(cid, faults.DROP_AFTER_ADVERTISE)
    keys = {k.client_id: k for k in book.keys}
    order = sorted(keys)
    t = secagg.threshold(len(order), runner.fed.min_answered_clients)
    if cid not in keys or len(order) < t:
        return None
    sr = SecureRound(cid=cid, round=round_no, attempt=attempt, cipher=cipher, mask=mask,
                     self_seed=secrets.token_bytes(32), book=keys, threshold=t)  # fmt: skip
    self_shares = secagg.split(sr.self_seed, len(order), t)
    mask_shares = secagg.split(mask.private_bytes(), len(order), t)
    bundle = pb.ShareBundle(client_id=cid, round=round_no)
    info = secagg.cipher_info(sr.round_id)
    for i, peer in enumerate(order):
        x = i + 1
        plain = secagg.pack_shares(x, self_shares[i][1], mask_shares[i][1])
        k = secagg.agree(cipher, keys[peer].cipher_pk, info)
        bundle.shares.add(sender=cid, recipient=peer, ciphertext=secagg.seal(k, cid, peer, plain))
    got = await runner.retry(f"{cid} ShareKeys", lambda: runner.stub.ShareKeys(bundle, metadata=runner.md(cid)))
    if got.aborted:
        return None
    runner.fault_point(cid, faults.DROP_AFTER_SHARE)
    mine = order.index(cid) + 1
    for sh in got.shares:
        if sh.sender not in keys:
            return _refuse(runner, sr, f"a share from {sh.sender!r}, who advertised no keys")
        k = secagg.agree(cipher, keys[sh.sender].cipher_pk, info)
        try:
            x, s_self, s_mask = secagg.unpack_shares(secagg.open_sealed(k, sh.sender, cid, sh.ciphertext))
        except InvalidTag:
            return _refuse(runner, sr, f"the share from {sh.sender} does not open: not sealed for this client")
        if x != mine:
            return _refuse(runner, sr, f"the share from {sh.sender} is for position {x}, not {mine}")
        sr.held[sh.sender] = (x, s_self, s_mask)
    u2 = set(got.sharers)
    if cid not in u2 or len(u2) < t or not u2 <= set(keys):
        return _refuse(runner, sr, f"U2 {sorted(u2)} must include this client, hold >= {t} clients and only ones "
                                   "that advertised keys")  # fmt: skip
    if set(sr.held) != u2:
        return _refuse(runner, sr, f"U2 {sorted(u2)} does not match the shares held, from {sorted(sr.held)}")
    sr.sharers = sorted(u2)
    return sr


def _refuse(runner: Runner, sr: SecureRound, why: str) -> None:
    runner.log(f"{sr.cid}: round {sr.round_id}: refusing to go on: {why}")


def flat_input(res: LocalResult, max_norm: float) -> np.ndarray:
    """n x update, flattened, then n: the sum over clients gives both parts of the weighted mean.
    The update is first clipped to `max_norm` (maxUpdateNorm): the aggregator cannot check one
    masked input, only that the sum stays within sum(n) x max_norm (secure_server.py)."""
    n = float(res.num_samples)
    flat = np.concatenate([t.reshape(-1).double().numpy() for _, t in res.update])
    norm = float(np.linalg.norm(flat))
    if norm > max_norm:
        flat *= max_norm / norm
    return np.concatenate([flat * n, np.array([n])])


async def push_masked(runner: Runner, sr: SecureRound, res: LocalResult, scalars: dict[str, Any]) -> pb.PushReply:
    fault = runner.faults.get(sr.cid)
    over = sr.book if fault == faults.MASK_OVER_KEY_BOOK else sr.sharers
    # The OVERSIZED test fault skips the clip: a hostile client's input, for the sum's check to catch.
    clip_to = np.inf if fault == faults.OVERSIZED else runner.fed.max_update_norm
    y = secagg.masked_input(
        secagg.to_ring(flat_input(res, clip_to)), me=sr.cid, self_seed=sr.self_seed, mask_keys=sr.mask,
        peers={u: sr.book[u].mask_pk for u in over}, round_id=sr.round_id,
    )  # fmt: skip
    wire = [("masked", torch.from_numpy(y.view(np.int64)))]
    header = codec.make_header(kind="masked", round=sr.round, tensors=wire, scalars=scalars)
    return await runner.retry(
        f"{sr.cid} PushUpdate", lambda: runner.stub.PushUpdate(iter(codec.encode(header, wire)), metadata=runner.md(sr.cid))
    )


async def reveal(runner: Runner, sr: SecureRound) -> None:
    runner.fault_point(sr.cid, faults.DROP_AFTER_MASKED_INPUT)
    ask = pb.UnmaskRequest(client_id=sr.cid, round=sr.round)
    plan = await runner.retry(f"{sr.cid} Unmask", lambda: runner.stub.Unmask(ask, metadata=runner.md(sr.cid)))
    if plan.aborted:
        return
    survivors, dropped = set(plan.survivors), set(plan.dropped)
    # Revealing both shares of one peer would unmask its input: refuse such a plan. Survivors and
    # dropped must split U2 exactly: a client outside U2 added no masks here to remove.
    if survivors & dropped or len(survivors) < sr.threshold or survivors | dropped != set(sr.sharers):
        runner.log(f"{sr.cid}: refusing an unmask plan that would reveal a client's input or that does not "
                   f"split U2 {sr.sharers}")  # fmt: skip
        return
    runner.fault_point(sr.cid, faults.DROP_BEFORE_REVEAL)
    out = pb.Reveal(client_id=sr.cid, round=sr.round)
    for owner, (x, s_self, s_mask) in sr.held.items():
        if owner in survivors:
            out.shares.add(owner=owner, x=x, y=secagg.share_to_bytes(s_self), what="self")
        elif owner in dropped:
            out.shares.add(owner=owner, x=x, y=secagg.share_to_bytes(s_mask), what="mask")
    await runner.retry(f"{sr.cid} RevealShares", lambda: runner.stub.RevealShares(out, metadata=runner.md(sr.cid)))
