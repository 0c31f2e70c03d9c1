"""The client's side of secure aggregation (Bonawitz et al. 2017): keys, shares, masked input, reveal.

See secagg.py for the protocol. The aggregator only relays: shares are sealed
for their recipient, and a client reveals, per peer, either the share of its
self-mask seed (peer survived) or of its mask key (peer dropped), never both.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..tensor_transport import codec
from ..tensor_transport.protos import tensor_transport_pb2 as pb
from . import secagg

if TYPE_CHECKING:
    from .client import ClientRunner, LocalResult


@dataclass
class SecureRound:
    cid: str
    round: int
    attempt: int
    cipher: secagg.KeyPair
    mask: secagg.KeyPair
    self_seed: bytes
    book: dict[str, pb.PublicKeys]
    # owner -> (x, share of owner's self seed, share of owner's mask key), from the owner's sealed bundle
    held: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def round_id(self) -> str:
        return f"{self.round}.{self.attempt}"


async def setup(runner: ClientRunner, cid: str, round_no: int, attempt: int) -> SecureRound | None:
    """Advertise keys, share secrets; None when the aggregator aborted the round."""
    cipher, mask = secagg.KeyPair.generate(), secagg.KeyPair.generate()
    book = await runner.stub.AdvertiseKeys(
        pb.PublicKeys(client_id=cid, round=round_no, cipher_pk=cipher.public_bytes(), mask_pk=mask.public_bytes()),
        metadata=runner.md(cid),
    )
    if book.aborted:
        return None
    keys = {k.client_id: k for k in book.keys}
    order = sorted(keys)
    t = secagg.threshold(len(order), runner.fed.min_answered_clients)
    if cid not in keys or len(order) < t:
        return None
    sr = SecureRound(cid=cid, round=round_no, attempt=attempt, cipher=cipher, mask=mask,
                     self_seed=secrets.token_bytes(32), book=keys)  # fmt: skip
    self_shares = secagg.split(sr.self_seed, len(order), t)
    mask_shares = secagg.split(mask.private_bytes(), len(order), t)
    bundle = pb.ShareBundle(client_id=cid, round=round_no)
    info = secagg.cipher_info(sr.round_id)
    for i, peer in enumerate(order):
        x = i + 1
        plain = secagg.pack_shares(x, self_shares[i][1], mask_shares[i][1])
        k = secagg.agree(cipher, keys[peer].cipher_pk, info)
        bundle.shares.add(sender=cid, recipient=peer, ciphertext=secagg.seal(k, cid, peer, plain))
    got = await runner.stub.ShareKeys(bundle, metadata=runner.md(cid))
    if got.aborted:
        return None
    for sh in got.shares:
        k = secagg.agree(cipher, keys[sh.sender].cipher_pk, info)
        x, s_self, s_mask = secagg.unpack_shares(secagg.open_sealed(k, sh.sender, cid, sh.ciphertext))
        if x != order.index(cid) + 1:
            return None  # a share meant for another position: refuse to go on
        sr.held[sh.sender] = (x, s_self, s_mask)
    return sr


def flat_input(res: LocalResult) -> np.ndarray:
    """n x update, flattened, then n: the sum over clients gives both parts of the weighted mean."""
    n = float(res.num_samples)
    parts = [t.reshape(-1).double().numpy() * n for _, t in res.update]
    return np.concatenate([*parts, np.array([n])])


async def push_masked(runner: ClientRunner, sr: SecureRound, res: LocalResult, scalars: dict[str, Any]) -> pb.PushReply:
    y = secagg.masked_input(
        secagg.to_ring(flat_input(res)), me=sr.cid, self_seed=sr.self_seed, mask_keys=sr.mask,
        peers={u: k.mask_pk for u, k in sr.book.items()}, round_id=sr.round_id,
    )  # fmt: skip
    wire = [("masked", torch.from_numpy(y.view(np.int64)))]
    header = codec.make_header(kind="masked", round=sr.round, tensors=wire, scalars=scalars)
    return await runner.stub.PushUpdate(iter(codec.encode(header, wire)), metadata=runner.md(sr.cid))


async def reveal(runner: ClientRunner, sr: SecureRound) -> None:
    plan = await runner.stub.Unmask(pb.UnmaskRequest(client_id=sr.cid, round=sr.round), metadata=runner.md(sr.cid))
    if plan.aborted:
        return
    survivors, dropped = set(plan.survivors), set(plan.dropped)
    t = secagg.threshold(len(sr.book), runner.fed.min_answered_clients)
    # Revealing both shares of one peer would unmask its input: refuse such a plan.
    if survivors & dropped or len(survivors) < t or not (survivors | dropped) <= set(sr.book):
        runner.log(f"{sr.cid}: refusing an unmask plan that would reveal a client's input")
        return
    out = pb.Reveal(client_id=sr.cid, round=sr.round)
    for owner, (x, s_self, s_mask) in sr.held.items():
        if owner in survivors:
            out.shares.add(owner=owner, x=x, y=secagg.share_to_bytes(s_self), what="self")
        elif owner in dropped:
            out.shares.add(owner=owner, x=x, y=secagg.share_to_bytes(s_mask), what="mask")
    await runner.stub.RevealShares(out, metadata=runner.md(sr.cid))
