"""The aggregator's side of secure aggregation (Bonawitz et al. 2017; see secagg.py).

A mixin of the Aggregator: the stage RPCs (keys, shares, unmask plan, reveals),
the masked-input sum, and the round driver that closes each stage and removes
the masks. The aggregator relays sealed shares; it reconstructs, per client,
either its self-mask seed (survivor) or its mask key (dropped), never both.

The sets follow the paper: U1 advertised keys, U2 shared (every masked input is
masked against exactly U2, which the ShareKeys reply names), U3 sent a masked
input (the survivors), and U2 - U3 dropped. Before a sum is published, its
unmasked weight (the last ring element, sum of n_u) must equal, exactly in the
ring, the total of the sample counts the survivors declared: a mask that did not
cancel turns into an abandoned round, never into a corrupted model.

No single masked input can be inspected, so what bounds a client is checked on the sum: honest
clients clip their update to maxUpdateNorm B before they scale it by their sample count n_u and
mask it (secure_client.py), and each declared n_u is at most the client's partition size
(aggregator.py). The unmasked sum of n_u x update must then have norm <= sum(n_u) x B, i.e. the
mean update norm <= B; a sum above that (plus the fixed point's rounding) is refused whole
(`norm`). One hostile client can still set the mean to any vector of norm <= B: the bound is on
the round, not on its share of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import grpc
import numpy as np
import torch
from disttrain_api.model import FederatedSpec

from ...tensor_transport.protos import tensor_transport_pb2 as pb
from . import secagg
from .rounds import Abandoned, RoundAttempt, wait_event


class Refused(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class SecureStages:
    fed: FederatedSpec
    current: RoundAttempt | None
    shapes: list[tuple[str, torch.Size]]
    numel: int
    log: Callable[[str], None]

    async def _client(self, context: grpc.aio.ServicerContext) -> str: ...  # noqa: D102 - the Aggregator's
    def _refuse(self, reason: str, who: str, message: str) -> None: ...  # noqa: D102

    def _add_masked(self, cid: str, ra: RoundAttempt, tensors: list[tuple[str, torch.Tensor]], n: float) -> None:
        s = ra.secure
        assert s is not None
        if not s.shares_closed.is_set() or cid not in s.sharers:
            raise Refused("not_sampled", f"did not share keys in round {ra.round_id}")
        if len(tensors) != 1 or tensors[0][1].dtype != torch.int64 or tuple(tensors[0][1].shape) != (self.numel + 1,):
            desc = [(n, str(t.dtype), tuple(t.shape)) for n, t in tensors][:2]
            raise Refused("bad_shape", f"masked input must be one int64 vector of {self.numel + 1}, got {desc}")
        y = tensors[0][1].numpy().view(np.uint64)
        with np.errstate(over="ignore"):
            if s.masked_sum is None:
                s.masked_sum = y.copy()
            else:
                s.masked_sum += y
        s.weights[cid] = n

    async def AdvertiseKeys(self, request: pb.PublicKeys, context: grpc.aio.ServicerContext) -> pb.KeyBook:
        cid = await self._client(context)
        ra = self.current
        if ra is None or ra.secure is None or request.round != ra.round or cid not in ra.served or ra.secure.keys_closed.is_set():
            self._refuse("stale", cid, f"key advertisement for round {request.round} outside its stage")
            return pb.KeyBook(round=request.round, aborted=True)
        s = ra.secure
        had = s.keys.get(cid)
        if had is not None and (had.cipher_pk, had.mask_pk) != (request.cipher_pk, request.mask_pk):
            # A retried call repeats its keys; other keys for the same client would let whoever sent
            # them hold that client's shares.
            self._refuse("duplicate", cid, f"a second, different key advertisement in round {ra.round_id}")
            return pb.KeyBook(round=ra.round, aborted=True)
        s.keys[cid] = pb.PublicKeys(client_id=cid, round=ra.round, cipher_pk=request.cipher_pk, mask_pk=request.mask_pk)
        if len(s.keys) == len(ra.sampled):
            s.keys_all.set()
        await s.keys_closed.wait()
        if s.aborted or cid not in s.keys:
            return pb.KeyBook(round=ra.round, aborted=True)
        return pb.KeyBook(round=ra.round, keys=list(s.keys.values()))

    async def ShareKeys(self, request: pb.ShareBundle, context: grpc.aio.ServicerContext) -> pb.ShareBundle:
        cid = await self._client(context)
        ra = self.current
        s = ra.secure if ra is not None else None
        if ra is None or s is None or request.round != ra.round or cid not in s.keys or s.shares_closed.is_set():
            self._refuse("stale", cid, f"shares for round {request.round} outside their stage")
            return pb.ShareBundle(round=request.round, aborted=True)
        for sh in request.shares:
            if sh.sender != cid or sh.recipient not in s.keys:
                self._refuse("bad_stream", cid, "a share names the wrong sender or an unknown recipient")
                return pb.ShareBundle(round=ra.round, aborted=True)
        if {sh.recipient for sh in request.shares} != set(s.keys) or len(request.shares) != len(s.keys):
            # Every member of U1 needs exactly one share from each sharer, or the masks of a client that
            # drops later could not be rebuilt.
            self._refuse("bad_stream", cid, "shares must go to every client that advertised keys, one each")
            return pb.ShareBundle(round=ra.round, aborted=True)
        for sh in request.shares:
            s.shares.setdefault(sh.recipient, {})[cid] = sh
        s.sharers.add(cid)
        if len(s.sharers) == len(s.keys):
            s.shares_all.set()
        await s.shares_closed.wait()
        if s.aborted or cid not in s.sharers:
            return pb.ShareBundle(round=ra.round, aborted=True)
        got = s.shares.get(cid, {})
        mine = [got[u] for u in sorted(s.sharers) if u in got]
        return pb.ShareBundle(client_id=cid, round=ra.round, shares=mine, sharers=sorted(s.sharers))

    async def Unmask(self, request: pb.UnmaskRequest, context: grpc.aio.ServicerContext) -> pb.UnmaskPlan:
        await self._client(context)
        ra = self.current
        if ra is None or ra.secure is None or request.round != ra.round:
            return pb.UnmaskPlan(round=request.round, aborted=True)
        s = ra.secure
        await s.plan_ready.wait()
        if s.aborted or s.plan is None:
            return pb.UnmaskPlan(round=ra.round, aborted=True)
        return s.plan

    async def RevealShares(self, request: pb.Reveal, context: grpc.aio.ServicerContext) -> pb.PushReply:
        cid = await self._client(context)
        ra = self.current
        s = ra.secure if ra is not None else None
        if ra is None or s is None or s.plan is None or request.round != ra.round or cid not in s.plan.survivors:
            self._refuse("stale", cid, f"reveal for round {request.round} outside its stage")
            return pb.PushReply(accepted=False, reason="stale")
        s.reveals[cid] = list(request.shares)
        if len(s.reveals) == len(s.plan.survivors):
            s.reveals_all.set()
        return pb.PushReply(accepted=True)

    async def _secure_round(self, ra: RoundAttempt) -> dict[str, torch.Tensor]:
        """The survivors' mean update; raises Abandoned when the round cannot be published."""
        s = ra.secure
        assert s is not None
        # Each stage has the whole timeout: a sampled client that never shows up costs one
        # timeout in the key stage, and must not eat the time the others need to train.
        timeout = float(self.fed.round_timeout_seconds)
        await wait_event(s.keys_all, timeout)
        # The threshold follows |U1|, which every client sees in its key book and computes t from.
        s.threshold = secagg.threshold(len(s.keys), s.min_answered)
        s.keys_closed.set()
        if len(s.keys) < s.threshold:
            raise Abandoned("too_few_keys", f"{len(s.keys)} clients advertised keys, threshold {s.threshold}")
        await wait_event(s.shares_all, timeout)
        s.shares_closed.set()
        if len(s.sharers) < s.threshold:
            raise Abandoned("too_few_shares", f"{len(s.sharers)} clients shared keys, threshold {s.threshold}")
        if len(ra.answered) >= len(s.sharers):
            ra.all_answered.set()
        ra.deadline = time.monotonic() + timeout
        await wait_event(ra.all_answered, ra.remaining())
        ra.open = False
        survivors = sorted(ra.answered)
        if len(survivors) < max(s.threshold, self.fed.min_answered_clients) or s.masked_sum is None:
            raise Abandoned("too_few_answers", f"{len(survivors)} masked inputs arrived; need "
                                               f"{max(s.threshold, self.fed.min_answered_clients)}")  # fmt: skip
        s.plan = pb.UnmaskPlan(round=ra.round, survivors=survivors, dropped=sorted(s.sharers - ra.answered))
        s.plan_ready.set()
        await wait_event(s.reveals_all, float(self.fed.round_timeout_seconds))
        total = self._unmask(ra)
        # The sanity check: the last element is sum(n_u) over U3, exactly, in the ring.
        expected = secagg.ring_sum([s.weights[u] for u in survivors])
        if int(total[-1]) != expected:
            got = float(secagg.from_ring(total[-1:])[0])
            raise Abandoned("weight_mismatch", f"the unmasked weight {got:.6g} is not the survivors' declared "
                                               f"total {sum(s.weights[u] for u in survivors):.6g}: a mask did not "
                                               "cancel (or a client's count differs from its input)")  # fmt: skip
        flat = torch.from_numpy(secagg.from_ring(total))
        weight = float(flat[-1])
        self._check_sum_norm(flat[:-1], weight, len(survivors))
        mean: dict[str, torch.Tensor] = {}
        pos = 0
        for n, shape in self.shapes:
            k = math.prod(shape)
            mean[n] = (flat[pos : pos + k] / weight).float().reshape(shape)
            pos += k
        return mean

    def _check_sum_norm(self, weighted_sum: torch.Tensor, weight: float, summed: int) -> None:
        """Refuse a sum of n_u x update above sum(n_u) x maxUpdateNorm (see the module docstring)."""
        bound = weight * self.fed.max_update_norm
        # Each input rounds to the ring's step: at most half a step per element and client.
        slack = math.sqrt(self.numel) * summed * 0.5 / secagg.SCALE + 1e-9 * bound
        norm = float(torch.linalg.vector_norm(weighted_sum))
        if not norm <= bound + slack:  # NaN-proof
            raise Abandoned("norm", f"the unmasked sum of weighted updates has L2 norm {norm:.6g}, above the "
                                    f"declared weight {weight:.6g} x maxUpdateNorm {self.fed.max_update_norm:.6g} "
                                    f"= {bound:.6g}: a client did not clip its update")  # fmt: skip

    def _unmask(self, ra: RoundAttempt) -> np.ndarray:
        s = ra.secure
        assert s is not None and s.plan is not None and s.masked_sum is not None
        wanted = {(u, "self") for u in s.plan.survivors} | {(u, "mask") for u in s.plan.dropped}
        pieces: dict[tuple[str, str], dict[int, int]] = {w: {} for w in wanted}
        order = sorted(s.keys)
        for revealer, shares in s.reveals.items():
            x = order.index(revealer) + 1  # a revealer holds the share at its own position only
            for sh in shares:
                if (sh.owner, sh.what) in pieces and sh.x == x:
                    pieces[(sh.owner, sh.what)][x] = secagg.share_from_bytes(sh.y)
        secrets_: dict[tuple[str, str], bytes] = {}
        for w, pts in pieces.items():
            if len(pts) < s.threshold:
                raise Abandoned("too_few_reveals", f"{len(s.reveals)} survivors revealed: {len(pts)} shares of "
                                                   f"{w[0]}'s {w[1]} secret, need {s.threshold}")  # fmt: skip
            try:
                secrets_[w] = secagg.combine(sorted(pts.items())[: s.threshold])
            except ValueError as e:
                raise Abandoned("bad_shares", f"{w[0]}'s {w[1]} secret: {e}") from None
        return secagg.unmask(
            s.masked_sum,
            survivors={u: secrets_[(u, "self")] for u in s.plan.survivors},
            dropped={u: secrets_[(u, "mask")] for u in s.plan.dropped},
            mask_public={u: k.mask_pk for u, k in s.keys.items()},
            round_id=ra.round_id,
        )
