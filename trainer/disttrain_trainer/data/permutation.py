"""A seeded permutation of [0, n) evaluated per index: memory independent of n.

A Feistel network over the bits of n - 1 (alternating unbalanced halves, so the domain 2^bits is
less than 2n) permutes [0, 2^bits); cycle-walking (apply it again while the result is >= n) turns
that into a permutation of [0, n) (Black and Rogaway, "Ciphers with arbitrary finite domains",
2002). Each index is mapped on its own, so a rank that needs positions 4096..4223 of an epoch's
order computes those 128 numbers and holds nothing else: no array of the whole order is ever
built (torchtitan, Megatron and MosaicML streaming also shuffle without one).

The round function is a 64-bit multiply-xorshift mix (splitmix64's finaliser) of the right half
and the round key; the round keys come from numpy's SeedSequence of the seed words, whose output
numpy keeps stable across versions. Four rounds: more than enough to scatter neighbours for SGD.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S1, _S2 = np.uint64(31), np.uint64(29)


class Permutation:
    """The permutation of [0, n) keyed by `seed` (a sequence of non-negative ints)."""

    def __init__(self, n: int, seed: Sequence[int]):
        if n < 1:
            raise ValueError(f"a permutation of [0, {n}) is empty")
        self.n = n
        self.bits = max(1, (n - 1).bit_length())
        keys = np.random.SeedSequence(list(seed)).generate_state(ROUNDS, np.uint64)
        # Per round: its key, the right half's width and mask, the left half's width and mask.
        self._plan = []
        right = self.bits // 2
        for key in keys:
            left = self.bits - right
            self._plan.append((np.uint64(key), np.uint64(right), np.uint64((1 << right) - 1),
                               np.uint64(left), np.uint64((1 << left) - 1)))  # fmt: skip
            right = left  # (L, R) -> (R, L xor F(R)): R moves up, so the widths swap

    def _rounds(self, x: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network over [0, 2^bits) (uint64 in, a new uint64 array out)."""
        for key, right, rmask, left, lmask in self._plan:
            lo = x & rmask
            h = lo + key
            h *= _M1
            h ^= h >> _S1
            h *= _M2
            h ^= h >> _S2
            h ^= x >> right  # L xor F(R)
            h &= lmask
            lo <<= left
            lo |= h
            x = lo
        return x

    def __call__(self, index: np.ndarray) -> np.ndarray:
        """The image of each index (int64 array in [0, n)), in the same shape."""
        if self.n == 1:
            return np.zeros_like(np.asarray(index, dtype=np.int64))
        x = self._rounds(np.asarray(index, dtype=np.uint64))
        n = np.uint64(self.n)
        where = np.flatnonzero(x >= n)
        if len(where):  # cycle-walk the few that left [0, n); at most half of them leave again each pass
            walking = x[where]
            while len(where):
                walking = self._rounds(walking)
                done = walking < n
                x[where[done]] = walking[done]
                where, walking = where[~done], walking[~done]
        return x.astype(np.int64)

    def table(self) -> np.ndarray:
        """All n images at once (int64, [perm(0), ..., perm(n - 1)]), the same as self(arange(n)):
        the network runs once over the whole domain (< 2n), and the walks follow that table."""
        if self.n == 1:
            return np.zeros(1, dtype=np.int64)
        g = self._rounds(np.arange(1 << self.bits, dtype=np.uint64)).astype(np.int64)
        out = g[: self.n]
        where = np.flatnonzero(out >= self.n)
        while len(where):
            out[where] = g[out[where]]
            where = where[out[where] >= self.n]
        return out.copy()
