"""Problem buffers: seeds, deduplication, a cap with an eviction policy, recent-first sampling, state.

Eviction policies (the ``eviction`` setting):

* ``oldest`` (ours): once the buffer holds ``cap`` problems, each new one evicts the oldest non-seed
  problem, so the buffer follows the population as it improves. Seeds are never evicted.
* ``reject_new`` (AZR released): the first ``cap`` problems stay and every later one is dropped.

Deduplication is exact on (program, inputs), as AZR dedupes on the serialised triplet.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from typing import Any

from populora_core.api.components import problem_from_record

from .problems import CodeProblem

EVICTIONS = ("oldest", "reject_new")


def as_random(rng: Any) -> random.Random:
    """Accept a ``random.Random``, an int seed or a numpy ``Generator``; never the global RNG."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, int) and not isinstance(rng, bool):
        return random.Random(rng)
    integers = getattr(rng, "integers", None)
    if callable(integers):
        return random.Random(int(integers(0, 2**63 - 1)))
    raise TypeError(f"rng must be random.Random, an int seed or a numpy Generator, not {type(rng).__name__}")


def problem_key(p: CodeProblem) -> tuple[str, tuple[str, ...]]:
    return (p.program.strip(), tuple(i.strip() for i in p.inputs))


def problem_to_dict(p: CodeProblem) -> dict[str, Any]:
    return dataclasses.asdict(p)


def problem_from_dict(d: dict[str, Any]) -> CodeProblem:
    """A buffered problem from its checkpoint record, every field checked against its type (``ValueError``
    otherwise): a checkpoint is data read from disk, never trusted to fit."""
    if not isinstance(d, dict):
        raise ValueError(f"buffer state: a problem is an object, not {type(d).__name__}")
    unknown = set(d) - {f.name for f in dataclasses.fields(CodeProblem)}
    if unknown:
        raise ValueError(f"buffer state: unknown problem field(s) {', '.join(sorted(unknown))}")
    problem = problem_from_record(CodeProblem, d)
    assert isinstance(problem, CodeProblem)
    return problem


class ProblemBuffer:
    """Valid problems of one task type, oldest first, each tagged with the add-generation it came in."""

    def __init__(self, seeds: Sequence[CodeProblem], cap: int = 16384, eviction: str = "oldest") -> None:
        if eviction not in EVICTIONS:
            raise ValueError(f"unknown eviction policy {eviction!r} (known: {', '.join(EVICTIONS)})")
        if cap < max(1, len(seeds)):
            raise ValueError(f"buffer cap {cap} is smaller than the {len(seeds)} seed problems")
        self.cap = cap
        self.eviction = eviction
        self.items: list[CodeProblem] = []
        self.generations: list[int] = []
        self.seed_count = 0
        self.generation = 0  # number of add() calls that added something
        self._keys: set[tuple[str, tuple[str, ...]]] = set()
        for seed in seeds:
            if self._insert(seed, 0):
                self.seed_count += 1

    def __len__(self) -> int:
        return len(self.items)

    def _insert(self, p: CodeProblem, generation: int) -> bool:
        key = problem_key(p)
        if key in self._keys:
            return False
        self.items.append(p)
        self.generations.append(generation)
        self._keys.add(key)
        return True

    def add(self, problems: Iterable[CodeProblem]) -> int:
        """Add the valid, new problems; returns how many were kept (after dedup and the cap)."""
        gen = self.generation + 1
        kept = 0
        for p in problems:
            if not p.valid or problem_key(p) in self._keys:
                continue
            if len(self.items) >= self.cap:
                if self.eviction == "reject_new" or len(self.items) <= self.seed_count:
                    continue
                old = self.items.pop(self.seed_count)
                self.generations.pop(self.seed_count)
                self._keys.discard(problem_key(old))
            if self._insert(p, gen):
                kept += 1
        if kept:
            self.generation = gen
        return kept

    def sample(self, count: int, rng: random.Random) -> list[CodeProblem]:
        """Up to ``count`` distinct problems, uniformly without replacement."""
        return rng.sample(self.items, min(count, len(self.items)))

    def recent_first(self, count: int, rng: random.Random) -> list[CodeProblem]:
        """AZR's ``max_new``: the latest generation's problems (up to ``count``), then uniform fill.

        The fill draws with replacement from the whole buffer, so duplicates are possible, as in AZR.
        """
        latest = [p for p, g in zip(self.items, self.generations, strict=True) if g == self.generation]
        picked = rng.sample(latest, min(count, len(latest)))
        while len(picked) < count and self.items:
            picked.append(self.items[rng.randrange(len(self.items))])
        return picked

    def state_dict(self) -> dict[str, Any]:
        return {
            "items": [problem_to_dict(p) for p in self.items],
            "generations": list(self.generations),
            "seed_count": self.seed_count,
            "generation": self.generation,
            "cap": self.cap,
            "eviction": self.eviction,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s data (from a checkpoint's JSON), checked field by field."""
        if not isinstance(state.get("items"), list) or not isinstance(state.get("generations"), list):
            raise ValueError("buffer state: items and generations are lists")
        items = [problem_from_dict(d) for d in state["items"]]
        if not all(type(g) is int for g in state["generations"]):
            raise ValueError("buffer state: generations are integers")
        generations = [int(g) for g in state["generations"]]
        if len(items) != len(generations):
            raise ValueError("buffer state: items and generations differ in length")
        self.items, self.generations = items, generations
        self.seed_count = int(state["seed_count"])
        self.generation = int(state["generation"])
        self._keys = {problem_key(p) for p in items}
