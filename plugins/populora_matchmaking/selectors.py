"""PBT selection schemes: which members die and whose children replace them (within one sub-population).

Every scheme ranks the whole sub-population but replaces only members in ``ready`` (PBT's readiness: they have
played ``evolution.ready_after`` rated matches); members not yet ready still rank and may be parents.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from populora_core.api.components import Replacement, Selector


def _ranked(members: Sequence[Any], k: float) -> list[Any]:
    """Best first by the conservative rating mu - k*sigma (ties by id for determinism)."""
    return sorted(members, key=lambda m: (-m.rating.conservative(k), m.id))


def _count(n: int, fraction: float) -> int:
    """At least one replaced, always at least one survivor."""
    return min(max(1, math.floor(n * fraction)), n - 1)


def _ready(members: Sequence[Any], ready: Collection[str] | None) -> set[str]:
    return {m.id for m in members} if ready is None else set(ready)


class Truncation(Selector):
    """The bottom ``fraction`` of the ready members by rating dies; children of two survivors replace it. A member
    not yet ready is not judged: the cut passes over it to the next ready one, so each selection replaces the
    fraction whatever the age of the bottom member."""

    def __init__(self, params: Any) -> None:
        self.params = params

    def survivors(self, n: int) -> int:
        return n - _count(n, self.params.fraction)

    def select(self, members: Sequence[Any], rng: Any, ready: Collection[str] | None = None) -> list[Replacement]:
        eligible = _ready(members, ready)
        ranked = _ranked(members, self.params.conservative_k)
        n_dead = _count(len(ranked), self.params.fraction)
        dead = {m.id for m in [m for m in ranked if m.id in eligible][-n_dead:]}
        survivors = [m for m in ranked if m.id not in dead]
        out = []
        for d in (m for m in ranked if m.id in dead):
            parents = rng.sample(survivors, min(2, len(survivors)))
            out.append(Replacement(d.id, [p.id for p in _ranked(parents, self.params.conservative_k)]))
        return out


class Tournament(Selector):
    """The worst ready entrant of a random tournament dies; winners of two more tournaments are its parents."""

    def __init__(self, params: Any) -> None:
        self.params = params

    def survivors(self, n: int) -> int:
        return n - _count(n, self.params.fraction)

    def select(self, members: Sequence[Any], rng: Any, ready: Collection[str] | None = None) -> list[Replacement]:
        k = self.params.conservative_k
        eligible = _ready(members, ready)
        pool = list(members)
        out = []
        for _ in range(_count(len(pool), self.params.fraction)):
            entrants = [m for m in rng.sample(pool, min(self.params.size, len(pool))) if m.id in eligible]
            if not entrants:
                continue
            loser = _ranked(entrants, k)[-1]
            pool.remove(loser)
            winners = [_ranked(rng.sample(pool, min(self.params.size, len(pool))), k)[0] for _ in range(2)]
            parents = list(dict.fromkeys(w.id for w in winners))
            out.append(Replacement(loser.id, parents))
        return out


class Tiered(Selector):
    """Classic PBT exploit/explore: keep the top, mutate the (ready) middle in place, replace the (ready) bottom."""

    def __init__(self, params: Any) -> None:
        self.params = params

    def _tiers(self, n: int) -> tuple[int, int]:
        n_keep = max(1, round(n * self.params.keep))
        return n_keep, min(round(n * self.params.mutate), n - n_keep)

    def survivors(self, n: int) -> int:
        return sum(self._tiers(n))  # a member mutated in place keeps its line

    def select(self, members: Sequence[Any], rng: Any, ready: Collection[str] | None = None) -> list[Replacement]:
        eligible = _ready(members, ready)
        ranked = _ranked(members, self.params.conservative_k)
        n_keep, n_mutate = self._tiers(len(ranked))
        top, middle, bottom = ranked[:n_keep], ranked[n_keep : n_keep + n_mutate], ranked[n_keep + n_mutate :]
        out = [Replacement(m.id, [m.id], mutation_only=True) for m in middle if m.id in eligible]
        out += [Replacement(m.id, [rng.choice(top).id], mutation_only=True) for m in bottom if m.id in eligible]
        return out
