"""populora_core.api.rng.hashed_seed: the one sha256 seed of the engines, equal to the formulas it replaced."""

import hashlib

from populora_core.api.rng import hashed_seed


def test_hashed_seed_keeps_the_engines_seeds():
    for parts in [(0, 1), ("fused", 3), (7, 2, 5)]:
        digest = hashlib.sha256(repr(parts).encode()).digest()
        assert hashed_seed(*parts, bits=32) == int.from_bytes(digest[:4], "little")  # decode.row_key
        assert hashed_seed(*parts, bits=31) == int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF  # vllm
        assert hashed_seed(*parts, bits=63) == int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF  # hf
