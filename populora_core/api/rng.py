"""Randomness derived from (recipe seed, step, phase): a resumed run draws exactly what an uninterrupted one would.

Every random choice of the loop names its phase (``"match"``, ``"propose/deduction"``, ``"evolution"``, ...), so
adding a draw to one phase never shifts the numbers another phase sees.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


def derived_rng(seed: int, step: int, phase: str) -> random.Random:
    return random.Random(f"{seed}/{step}/{phase}")


def derived_seed(seed: int, step: int, phase: str) -> int:
    return derived_rng(seed, step, phase).randrange(2**31)


def hashed_seed(*parts: object, bits: int) -> int:
    """A ``bits``-bit seed from the sha256 of ``repr(parts)`` (little-endian): the same parts give the same
    seed in every process and Python version (``hash()`` is salted per process)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[: (bits + 7) // 8], "little") & ((1 << bits) - 1)


@dataclass(frozen=True)
class Streams:
    """A run's only source of randomness: every draw named by (step, phase) under the recipe's seed.

    ``seed`` here is the recipe's seed; what the methods return are generators and integer sampling seeds
    derived from it, so the loop never re-derives one by hand.
    """

    seed: int

    def rng(self, step: int, phase: str) -> random.Random:
        return derived_rng(self.seed, step, phase)

    def seed_for(self, step: int, phase: str) -> int:
        """An integer seed for (step, phase): a sampler's, or a fresh adapter's initialisation."""
        return derived_seed(self.seed, step, phase)

    def task_rng(self, index: int) -> random.Random:
        """The ``index``-th recipe task's own generator (its buffers' draws), fixed for the run's life."""
        return random.Random(f"{self.seed}/task/{index}")
