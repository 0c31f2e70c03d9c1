"""Secure aggregation primitives (Bonawitz et al. 2017, "Practical Secure Aggregation").

Each sampled client u, every round:
  - makes two X25519 key pairs: `cipher` (encrypts what it sends to peers via the
    aggregator) and `mask` (agrees a pairwise mask seed s_uv with every peer v);
  - draws a self-mask seed b_u;
  - Shamir-splits b_u and its mask private key into shares with threshold t, one
    per peer, each encrypted (AES-GCM) under the pair's cipher key, so the
    aggregator relays them without reading them;
  - sends y_u = x_u + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv) over the
    ring Z_2^64 (x_u is the update in fixed point), v ranging over U2, the clients whose
    shares the aggregator received (not everyone who advertised keys: a client that
    advertised and dropped before sharing left no shares to rebuild its masks from):
    pairwise masks cancel in the sum.
For the sum, the aggregator asks the survivors for shares of each survivor's b_u
(to remove its self mask) and of each dropped client's mask key (to rebuild and
remove the pairwise masks the survivors added for it); never both for one client.
The self mask is what keeps a late (not dropped) client's input hidden even after
its pairwise masks were removed.

Fixed point: x * 2^FRACTION_BITS rounded; sums of a few hundred weighted
updates stay far inside int64.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FRACTION_BITS = 20
SCALE = float(1 << FRACTION_BITS)
# Shamir over GF(p) with the Mersenne prime 2^521 - 1: any 32-byte secret fits.
PRIME = (1 << 521) - 1
SECRET_BYTES = 32
SHARE_BYTES = 66  # 521 bits


# ------------------------------------------------------------------ keys and PRG


@dataclass(frozen=True)
class KeyPair:
    private: X25519PrivateKey

    @classmethod
    def generate(cls) -> KeyPair:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def public_bytes(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )


def agree(own: KeyPair, peer_public: bytes, info: bytes) -> bytes:
    """A 32-byte key both ends of a pair derive (X25519 + HKDF-SHA256, bound to `info`)."""
    shared = own.private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def prg(seed: bytes, n: int) -> np.ndarray:
    """n pseudo-random uint64 from a 32-byte seed: the AES-256-CTR keystream."""
    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\0" * 16)).encryptor()
    return np.frombuffer(enc.update(bytes(8 * n)) + enc.finalize(), dtype=np.uint64).copy()


def mask_info(round_id: str) -> bytes:
    return b"disttrain-secagg-mask:" + round_id.encode()


def cipher_info(round_id: str) -> bytes:
    return b"disttrain-secagg-cipher:" + round_id.encode()


# ------------------------------------------------------------------ fixed point


def to_ring(x: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(x, dtype=np.float64) * SCALE).astype(np.int64).view(np.uint64)


def from_ring(y: np.ndarray) -> np.ndarray:
    return y.view(np.int64).astype(np.float64) / SCALE


def ring_sum(values: list[float]) -> int:
    """sum(to_ring(v)) in Z_2^64, as an int: what the unmasked sum's element for these values must be."""
    return int(sum(int(r) for r in to_ring(np.asarray(values, dtype=np.float64))) % (1 << 64))


def pair_sign(u: str, v: str) -> int:
    return 1 if u < v else -1


def masked_input(
    x_ring: np.ndarray,
    *,
    me: str,
    self_seed: bytes,
    mask_keys: KeyPair,
    peers: dict[str, bytes],  # U2: every client whose shares were received -> its mask public key
    round_id: str,
) -> np.ndarray:
    """y_u: the fixed-point input plus the self mask and the pairwise masks (wrapping uint64)."""
    y = x_ring.copy()
    n = len(y)
    with np.errstate(over="ignore"):
        y += prg(self_seed, n)
        for v, pk in peers.items():
            if v == me:
                continue
            p = prg(agree(mask_keys, pk, mask_info(round_id)), n)
            if pair_sign(me, v) > 0:
                y += p
            else:
                y -= p
    return y


def unmask(
    total: np.ndarray,
    *,
    survivors: dict[str, bytes],  # survivor -> its self-mask seed b_v
    dropped: dict[str, bytes],  # dropped client -> its mask private key
    mask_public: dict[str, bytes],  # every client's mask public key
    round_id: str,
) -> np.ndarray:
    """The plain sum of the survivors' inputs from the sum of their masked inputs."""
    y = total.copy()
    n = len(y)
    with np.errstate(over="ignore"):
        for seed in survivors.values():
            y -= prg(seed, n)
        for u, sk in dropped.items():
            keys = KeyPair.from_private_bytes(sk)
            for v in survivors:
                p = prg(agree(keys, mask_public[v], mask_info(round_id)), n)
                # v added sign(v, u) * p for the pair; take it back out.
                if pair_sign(v, u) > 0:
                    y -= p
                else:
                    y += p
    return y


# ------------------------------------------------------------------ Shamir


def split(secret: bytes, n: int, t: int) -> list[tuple[int, int]]:
    """n shares (x = 1..n) of `secret`; any t of them recover it, fewer reveal nothing."""
    if not 1 <= t <= n:
        raise ValueError(f"threshold {t} must be in [1, {n}]")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        acc = 0
        for c in reversed(coeffs):
            acc = (acc * x + c) % PRIME
        shares.append((x, acc))
    return shares


def combine(shares: list[tuple[int, int]], length: int = SECRET_BYTES) -> bytes:
    """Lagrange interpolation at 0."""
    total = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, (xj, _) in enumerate(shares):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    if total >> (8 * length):
        # A secret is < 2^256; anything else means too few or tampered shares (chance ~2^-265).
        raise ValueError(f"the shares do not interpolate to a {length}-byte secret (too few, or tampered)")
    return total.to_bytes(length, "big")


def share_to_bytes(y: int) -> bytes:
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(b: bytes) -> int:
    return int.from_bytes(b, "big")


# ------------------------------------------------------------------ share envelopes


def seal(key: bytes, sender: str, recipient: str, plaintext: bytes) -> bytes:
    nonce = secrets.token_bytes(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, f"{sender}->{recipient}".encode())


def open_sealed(key: bytes, sender: str, recipient: str, blob: bytes) -> bytes:
    return AESGCM(key).decrypt(blob[:12], blob[12:], f"{sender}->{recipient}".encode())


def pack_shares(x: int, self_share: int, mask_share: int) -> bytes:
    return x.to_bytes(4, "big") + share_to_bytes(self_share) + share_to_bytes(mask_share)


def unpack_shares(b: bytes) -> tuple[int, int, int]:
    x = int.from_bytes(b[:4], "big")
    s = share_from_bytes(b[4 : 4 + SHARE_BYTES])
    m = share_from_bytes(b[4 + SHARE_BYTES : 4 + 2 * SHARE_BYTES])
    return x, s, m


def threshold(sampled: int, min_answered: int) -> int:
    """t > n/2 (an honest majority must hold shares), and never below the round's minimum."""
    return max(2, min_answered, sampled // 2 + 1) if sampled >= 2 else 1
