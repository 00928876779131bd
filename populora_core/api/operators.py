"""The public half of evolution: how many parents an operator takes, and how selection is asked (readiness, a
child's first rating, the selector's answer checked). Making a child (:func:`apply_operator`, which runs the
operator with a seeded torch generator) is :mod:`populora_core.services.operators`.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .components import MatchOutcome, Replacement
from .errors import PluginError
from .params import Component, accepted_arguments
from .population import Member, Rating


def operator_arity(component: Component) -> tuple[int, int | None]:
    """(fewest, most) parents an operator takes, as registered: ``min_parents=``, ``max_parents=`` (None: no bound)."""
    meta = component.meta
    if "min_parents" not in meta:
        raise PluginError(
            f"operator {component.name!r} (plugin {component.plugin}) does not declare how many parents it takes "
            "(register it with min_parents= and max_parents=)"
        )
    low, high = meta["min_parents"], meta.get("max_parents")
    if low < 1 or (high is not None and high < low):
        raise PluginError(f"operator {component.name!r} (plugin {component.plugin}): bad arity {low}..{high}")
    return low, high


def arity_text(component: Component) -> str:
    low, high = operator_arity(component)
    if high is None:
        return f"{low} or more"
    return f"exactly {low}" if low == high else f"{low} to {high}"


def count_matches(members: Mapping[str, Member], outcomes: Sequence[MatchOutcome]) -> None:
    """A rated match counts for its teacher, and for its student when it had a valid problem to solve."""
    for o in outcomes:
        members[o.teacher].counters.matches += 1
        if o.solve_rate is not None:
            members[o.student].counters.matches += 1


def ready_ids(members: list[Member], readiness: int) -> set[str]:
    """PBT's readiness: the members that have played ``readiness`` rated matches and so may be replaced."""
    return {m.id for m in members if m.counters.matches >= readiness}


def child_rating(parents: Sequence[Rating], policy: str, spread: float, *, prior: Rating) -> Rating:
    """A child's first rating from its parents' (best first). ``widen``: the parents' mean mu and their mean sigma
    widened by ``spread`` (in quadrature, at most the ``prior``'s, the matchmaker's): a child is a small step from
    its parents in weight space, so it starts where they stand, but less certain, and its own matches decide it;
    ``inherit``: its first parent's mu and sigma (its certainty too); ``fresh``: the prior, whose large sigma ranks
    it last."""
    if policy == "fresh":
        return Rating(prior.mu, prior.sigma)
    if policy == "inherit":
        return Rating(parents[0].mu, parents[0].sigma)
    sigma = math.sqrt(statistics.fmean(p.sigma for p in parents) ** 2 + spread**2)
    return Rating(statistics.fmean(p.mu for p in parents), min(sigma, prior.sigma))


def select(selector: Any, members: list[Member], rng: random.Random, ready: set[str]) -> list[Replacement]:
    """The selector's replacements for one sub-population; only ready members may be replaced."""
    reps = selector.select(members, rng, **accepted_arguments(selector.select, {"ready": ready}))
    for rep in reps:
        if rep.dead not in ready:
            raise PluginError(
                f"selector {type(selector).__name__} replaced {rep.dead!r}, which is not ready yet "
                f"(ready: {sorted(ready)}); a selector must take `ready` and replace only those members"
            )
    return reps
