"""Selection on synthetic members: what a matchmaker, a selector and a child-rating policy do together.

Members have a hidden skill on the TrueSkill scale; each step the matchmaker pairs teachers with students, a
student's solve rate is drawn from Binomial(samples, Phi((skill_s - skill_t) / (sqrt(2) beta))) / samples and
rated exactly as the loop rates it, and every ``every`` steps the core's selection (readiness, child rating) runs
through the selector. It answers in seconds what a run answers in hours: whether the youngest member is replaced
more often than chance when all are equal, and whether the weakest member is the one replaced when they differ.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from populora_core.components import MatchOutcome
from populora_core.operators import child_rating, ready_ids, select
from populora_core.population import Population, selection_history

BETA = 25.0 / 6.0


def true_solve_probability(student_skill: float, teacher_skill: float, beta: float = BETA) -> float:
    return 0.5 * (1 + math.erf((student_skill - teacher_skill) / (math.sqrt(2) * beta) / math.sqrt(2)))


def simulate(
    *,
    matchmaker: Any,
    selector: Any,
    teachers: int,
    students: int,
    every: int,
    steps: int,
    seed: int,
    child_policy: str = "inherit",
    readiness: int | None = None,
    samples: int = 36,
    skill: Callable[[random.Random], float] = lambda rng: 0.0,
    child_skill: Callable[[float, random.Random], float] = lambda parent, rng: parent,
) -> dict[str, Any]:
    """One simulated run; returns its lineage records and, per replacement, whether the weakest member died."""
    rng = random.Random(seed)
    population = Population.create(teachers, students)
    skills = {m: skill(rng) for m in population.members}
    lineage: list[dict[str, Any]] = [
        {"step": 0, "member": m.id, "role": m.role, "parents": []} for m in population.members.values()
    ]
    weakest_hits = weakest_chances = 0
    for step in range(1, steps + 1):
        outcomes = []
        for match in matchmaker.pair(population.teachers, population.students, rng):
            p = true_solve_probability(skills[match.student], skills[match.teacher])
            rate = sum(rng.random() < p for _ in range(samples)) / samples
            outcomes.append(MatchOutcome(match.teacher, match.student, rate, match.expected_solve_rate))
        matchmaker.update_ratings(outcomes, population.members)
        if step % every or step >= steps:
            continue
        for role, group in sorted(population.subpopulations().items()):
            if len(group) < 2:
                continue
            reps = select(selector, group, rng, ready_ids(group, step, every if readiness is None else readiness))
            weakest = sorted(group, key=lambda m: skills[m.id])[: len(reps)]
            weakest_hits += len({r.dead for r in reps} & {m.id for m in weakest})
            weakest_chances += len(reps)
            for rep in reps:
                parent = population.members[rep.parents[0]]
                dead = population.remove(rep.dead)
                child = population.add_new(dead.id.rstrip("0123456789"), role, born_step=step)
                child.rating = child_rating(parent.rating, child_policy)
                skills[child.id] = child_skill(skills[parent.id], rng)
                lineage.append(
                    {"step": step, "member": child.id, "role": role, "replaced": dead.id, "parents": rep.parents}
                )
    return {"lineage": lineage, "weakest_replaced": weakest_hits, "replacements": weakest_chances}


def selection_study(trials: int, **settings: Any) -> dict[str, Any]:
    """``simulate`` over seeds 0..trials-1, summed: youngest replaced vs chance, weakest replaced, survivor changes."""
    total: dict[str, float] = {}
    for seed in range(trials):
        run = simulate(seed=seed, **settings)
        history = selection_history(run["lineage"])
        for key, value in [*history.items(), ("weakest_replaced", run["weakest_replaced"])]:
            total[key] = total.get(key, 0) + value
        total["replacements"] = total.get("replacements", 0) + run["replacements"]
    counted = total.get("replacements_after_first", 0) or 1
    return {
        **total,
        "youngest_share": total.get("youngest_replaced", 0) / counted,
        "youngest_share_by_chance": total.get("youngest_replaced_by_chance", 0) / counted,
        "survivor_change_share": total.get("survivor_changes", 0) / (total.get("survivor_comparisons", 0) or 1),
        "weakest_share": total.get("weakest_replaced", 0) / (total.get("replacements", 0) or 1),
    }
