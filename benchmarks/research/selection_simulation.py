"""Selection on synthetic members: what a matchmaker, a selector and a child-rating policy do together.

Members have a hidden skill on the TrueSkill scale; each step the matchmaker pairs teachers with students, a
student's solve rate is drawn from Binomial(samples, Phi((skill_s - skill_t) / (sqrt(2) beta))) / samples and
rated exactly as the loop rates it (matches counted for readiness), and every ``evolution.every`` steps the core's
selection (the recipe's readiness and child rating, the matchmaker's prior) runs through the selector. It answers in
seconds what a run answers in hours: whether the youngest member is replaced more often than chance when all are
equal, and whether the weakest member is the one replaced when they differ. ``python -m
benchmarks.research.selection`` runs it on every shipped recipe.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from populora_core.api.components import MatchOutcome
from populora_core.api.operators import child_rating, count_matches, ready_ids, select
from populora_core.api.population import BETA, Population
from populora_core.api.schema import EvolutionSection
from populora_core.services.statistics import selection_history


def true_solve_probability(student_skill: float, teacher_skill: float) -> float:
    """Phi((skill_s - skill_t) / (sqrt(2) beta)): the hidden skills' solve probability on TrueSkill's scale."""
    return 0.5 * (1 + math.erf((student_skill - teacher_skill) / (math.sqrt(2) * BETA) / math.sqrt(2)))


def simulate(
    *,
    matchmaker: Any,
    selector: Any,
    teachers: int,
    students: int,
    evolution: EvolutionSection,
    steps: int,
    seed: int,
    samples: int = 36,
    skill: Callable[[random.Random], float] = lambda rng: 0.0,
    child_skill: Callable[[float, random.Random], float] = lambda parent, rng: parent,
) -> dict[str, Any]:
    """One simulated run; returns its lineage records and, per replacement, whether the weakest member died and
    whether the youngest of the members that were ready died (with the share chance gives)."""
    rng = random.Random(seed)
    population = Population.create(teachers, students, prior=matchmaker.prior())
    skills = {m: skill(rng) for m in population.members}
    lineage: list[dict[str, Any]] = [
        {"step": 0, "member": m.id, "role": m.role, "parents": []} for m in population.members.values()
    ]
    weakest_hits = weakest_chances = 0
    weakest_chance = 0.0
    young_hits = young_counted = 0
    young_chance = 0.0
    for step in range(1, steps + 1):
        outcomes = []
        for match in matchmaker.pair(population.teachers, population.students, rng):
            p = true_solve_probability(skills[match.student], skills[match.teacher])
            rate = sum(rng.random() < p for _ in range(samples)) / samples
            outcomes.append(MatchOutcome(match.teacher, match.student, rate, match.expected_solve_rate))
        matchmaker.update_ratings(outcomes, population.members)
        count_matches(population.members, outcomes)
        if step % evolution.every or step >= steps:
            continue
        for role, group in sorted(population.subpopulations().items()):
            if len(group) < 2:
                continue
            ready = ready_ids(group, evolution.readiness)
            reps = select(selector, group, rng, ready)
            weakest = sorted(group, key=lambda m: skills[m.id])[: len(reps)]
            weakest_hits += len({r.dead for r in reps} & {m.id for m in weakest})
            weakest_chances += len(reps)
            weakest_chance += len(reps) * len(reps) / len(group)  # a random pick of len(reps) hits that many of them
            born = {m.id: m.born_step for m in group if m.id in ready}
            if born and len(set(born.values())) > 1:
                youngest = {m for m, b in born.items() if b == max(born.values())}
                young_hits += len({r.dead for r in reps} & youngest)
                young_counted += len(reps)
                young_chance += len(reps) * len(youngest) / len(born)
            for rep in reps:
                parents = [population.members[p] for p in rep.parents]
                dead = population.remove(rep.dead)
                child = population.add_new(dead.id.rstrip("0123456789"), role, born_step=step)
                child.rating = child_rating(
                    [p.rating for p in parents], evolution.child_rating, evolution.child_sigma, prior=matchmaker.prior()
                )
                skills[child.id] = child_skill(skills[parents[0].id], rng)
                lineage.append(
                    {"step": step, "member": child.id, "role": role, "replaced": dead.id, "parents": rep.parents}
                )
    return {
        "lineage": lineage,
        "weakest_replaced": weakest_hits,
        "replacements": weakest_chances,
        "weakest_by_chance": weakest_chance,
        "youngest_ready_replaced": young_hits,
        "youngest_ready_by_chance": young_chance,
        "replacements_among_ages": young_counted,
    }


def selection_study(trials: int, **settings: Any) -> dict[str, Any]:
    """``simulate`` over seeds 0..trials-1, summed: youngest replaced vs chance (among all members, and among the
    ready ones), weakest replaced, survivor changes."""
    total: dict[str, float] = {}
    for seed in range(trials):
        run = simulate(seed=seed, **settings)
        history = selection_history(run["lineage"])
        extra = [(k, run[k]) for k in ("weakest_replaced", "weakest_by_chance", "replacements")]
        extra += [(k, run[k]) for k in ("youngest_ready_replaced",)]
        extra += [(k, run[k]) for k in ("youngest_ready_by_chance", "replacements_among_ages")]
        for key, value in [*history.items(), *extra]:
            total[key] = total.get(key, 0) + value
    counted = total.get("replacements_after_first", 0) or 1
    among_ages = total.get("replacements_among_ages", 0) or 1
    return {
        **total,
        "youngest_share": total.get("youngest_replaced", 0) / counted,
        "youngest_share_by_chance": total.get("youngest_replaced_by_chance", 0) / counted,
        "youngest_ready_share": total.get("youngest_ready_replaced", 0) / among_ages,
        "youngest_ready_share_by_chance": total.get("youngest_ready_by_chance", 0) / among_ages,
        "survivor_change_share": total.get("survivor_changes", 0) / (total.get("survivor_comparisons", 0) or 1),
        "weakest_share": total.get("weakest_replaced", 0) / (total.get("replacements", 0) or 1),
        "weakest_share_by_chance": total.get("weakest_by_chance", 0) / (total.get("replacements", 0) or 1),
    }
