"""PBT selection schemes: which members die and whose children replace them (within one sub-population)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from populora_core.components import Replacement


def _ranked(members: Sequence[Any], k: float) -> list[Any]:
    """Best first by the conservative rating mu - k*sigma (ties by id for determinism)."""
    return sorted(members, key=lambda m: (-m.rating.conservative(k), m.id))


def _count(n: int, fraction: float) -> int:
    """At least one replaced, always at least one survivor."""
    return min(max(1, math.floor(n * fraction)), n - 1)


class Truncation:
    def __init__(self, params: Any) -> None:
        self.params = params

    def select(self, members: Sequence[Any], rng: Any) -> list[Replacement]:
        ranked = _ranked(members, self.params.conservative_k)
        n_dead = _count(len(ranked), self.params.fraction)
        survivors, dead = ranked[:-n_dead], ranked[-n_dead:]
        out = []
        for d in dead:
            parents = rng.sample(survivors, min(2, len(survivors)))
            out.append(Replacement(d.id, [p.id for p in _ranked(parents, self.params.conservative_k)]))
        return out


class Tournament:
    def __init__(self, params: Any) -> None:
        self.params = params

    def select(self, members: Sequence[Any], rng: Any) -> list[Replacement]:
        k = self.params.conservative_k
        pool = list(members)
        out = []
        for _ in range(_count(len(pool), self.params.fraction)):
            entrants = rng.sample(pool, min(self.params.size, len(pool)))
            loser = _ranked(entrants, k)[-1]
            pool.remove(loser)
            winners = [_ranked(rng.sample(pool, min(self.params.size, len(pool))), k)[0] for _ in range(2)]
            parents = list(dict.fromkeys(w.id for w in winners))
            out.append(Replacement(loser.id, parents))
        return out


class Tiered:
    def __init__(self, params: Any) -> None:
        self.params = params

    def select(self, members: Sequence[Any], rng: Any) -> list[Replacement]:
        ranked = _ranked(members, self.params.conservative_k)
        n = len(ranked)
        n_keep = max(1, round(n * self.params.keep))
        n_mutate = min(round(n * self.params.mutate), n - n_keep)
        top, middle, bottom = ranked[:n_keep], ranked[n_keep : n_keep + n_mutate], ranked[n_keep + n_mutate :]
        out = [Replacement(m.id, [m.id], mutation_only=True) for m in middle]
        out += [Replacement(m.id, [rng.choice(top).id], mutation_only=True) for m in bottom]
        return out
