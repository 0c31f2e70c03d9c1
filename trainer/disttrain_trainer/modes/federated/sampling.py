"""Which clients a round attempt samples: over all `clients`, from draws nobody but the aggregator
can compute.

Every client gets one uniform draw per round attempt, HMAC-SHA256 of (round, attempt, client id)
under a sampling key (a PRF: without the key the draws are unpredictable and independent). The
key is HMAC-SHA256(server key, salt): the server key is the one secret only the aggregator holds
(clients hold credentials derived from it under another domain), the salt is 32 random bytes
drawn from the OS when the aggregator first starts. The salt alone reveals nothing and goes into
the aggregator's checkpoint, so a resumed aggregator redraws exactly the samples the interrupted
one drew (same round, same attempt, same clients); two runs of one spec never share a salt, so
they sample differently even with the same server key. The job's spec (and `data.seed`) plays no
part.

Two rules, one per accountant:
  poisson(q)    each client independently with probability q: the Sampled Gaussian Mechanism that
                Opacus's RDP accountant analyses (Mironov, Talwar and Zhang 2019), used with central
                differential privacy at q = clientsPerRound / clients. The sample size varies.
  fixed(k)      exactly k clients, uniform without replacement (the k smallest draws): plain rounds,
                which no accountant reads.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disttrain_api.model import FederatedSpec

SALT_BYTES = 32
_KEY_DOMAIN = b"disttrain-client-sampling-v1\n"
_DRAW_BITS = 64


class ClientSampler:
    def __init__(self, server_key: bytes, clients: Sequence[str], salt: bytes | None = None):
        self._server_key = server_key
        self.clients = sorted(clients)
        self._set_salt(salt if salt is not None else secrets.token_bytes(SALT_BYTES))

    def _set_salt(self, salt: bytes) -> None:
        if len(salt) != SALT_BYTES:
            raise ValueError(f"a sampling salt has {SALT_BYTES} bytes, got {len(salt)}")
        self.salt = salt
        self._key = hmac.new(self._server_key, _KEY_DOMAIN + salt, hashlib.sha256).digest()

    def draw(self, cid: str, round_no: int, attempt: int) -> float:
        """The client's uniform draw in [0, 1) for this round attempt."""
        mac = hmac.new(self._key, f"{round_no}.{attempt}:{cid}".encode(), hashlib.sha256).digest()
        return int.from_bytes(mac[: _DRAW_BITS // 8], "big") / (1 << _DRAW_BITS)

    def poisson(self, rate: float, round_no: int, attempt: int) -> list[str]:
        """Every client whose draw is below `rate`: each one in with probability `rate`, independently."""
        return [c for c in self.clients if self.draw(c, round_no, attempt) < rate]

    def fixed(self, k: int, round_no: int, attempt: int) -> list[str]:
        """Exactly k clients, every k-subset equally likely: the k smallest draws."""
        ranked = sorted(self.clients, key=lambda c: (self.draw(c, round_no, attempt), c))
        return sorted(ranked[:k])

    def for_round(self, fed: FederatedSpec, round_no: int, attempt: int) -> list[str]:
        """The spec's rule: Poisson at rate clientsPerRound / clients with central DP (what the
        accountant analyses), else exactly clientsPerRound."""
        if fed.privacy is not None:
            return self.poisson(fed.clients_per_round / fed.clients, round_no, attempt)
        return self.fixed(fed.clients_per_round, round_no, attempt)

    def state_dict(self) -> dict[str, Any]:
        return {"salt": self.salt.hex()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._set_salt(bytes.fromhex(str(state["salt"])))
