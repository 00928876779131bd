"""Randomness derived from (recipe seed, step, phase): a resumed run draws exactly what an uninterrupted one would.

Every random choice of the loop names its phase (``"match"``, ``"propose/deduction"``, ``"evolution"``, ...), so
adding a draw to one phase never shifts the numbers another phase sees.
"""

from __future__ import annotations

import random


def derived_rng(seed: int, step: int, phase: str) -> random.Random:
    return random.Random(f"{seed}/{step}/{phase}")


def derived_seed(seed: int, step: int, phase: str) -> int:
    return derived_rng(seed, step, phase).randrange(2**31)
