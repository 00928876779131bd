"""Benchmark: does selection select? Every shipped recipe's matchmaker and selector on simulated members.

    python -m benchmarks.research.selection          # every recipe with evolution, 40 seeded simulations per setting
    python -m benchmarks.research.selection --quick  # 2 simulations per setting (CI)
    python -m benchmarks.research.selection --recipes recipes/nano.yaml --trials 100

For each recipe (its population, `evolution.every`, readiness, selector and matchmaker with their params, built
through the registry as a run builds them; `steps` as in the recipe), `selection_simulation.py` beside it plays the
run's matches between members of hidden skill and applies the core's selection. Per child-rating policy (the
recipe's, and `inherit` or `widen` beside it) it prints:
- equal skill: the share of replacements (after a role's first) that hit its youngest members, against the
  share chance gives (their share of the role); the same among the members that were ready (readiness shields
  the newest child: this is where a widened rating could doom it); how often the members surviving a
  replacement change;
- skills spread (N(0, beta) at start, each child its parent's skill + N(0, beta)): the share of replacements
  that hit the weakest members (chance: the replaced fraction).
A youngest share far above chance means the newest child dies whatever it does: selection compares nothing.
Beside each share, its design's minimum detectable effect (MDE): the smallest departure from the chance share
that this many replacements detect with 80 % power at two-sided 5 %, taking replacements as independent
Bernoulli draws at the chance share (they are not quite: one simulation's replacements share its ratings).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from populora_core.api.population import BETA

REPO = Path(__file__).resolve().parents[2]


def recipe_settings(path: Path) -> dict[str, Any] | None:
    """The simulation's settings from a recipe, or None when the recipe never evolves."""
    from populora_core.api import get_registry
    from populora_core.cli import driver

    recipe, _ = driver.load_recipe(path)
    evo = recipe.evolution
    if not evo.every or recipe.population.mode != "population" or recipe.steps <= evo.every:
        return None
    registry = get_registry()
    return {
        "matchmaker": registry.get("matchmaker", recipe.matchmaker.name).build(recipe.matchmaker.params),
        "selector": registry.get("selector", evo.selector.name).build(evo.selector.params),
        "teachers": recipe.population.teachers,
        "students": recipe.population.students,
        "evolution": evo,
        "steps": recipe.steps,
        "key": json.dumps(
            [recipe.steps, recipe.population.model_dump(), evo.model_dump(), recipe.matchmaker.model_dump()],
            sort_keys=True,
        ),
    }


def share_mde(chance: float, replacements: float) -> float | None:
    """The smallest departure from a chance share ``chance`` that ``replacements`` Bernoulli draws detect (80 %
    power, two-sided 5 %); None without replacements."""
    from populora_core.services.statistics import min_detectable_effect

    if replacements < 1:
        return None
    return min_detectable_effect((chance * (1 - chance)) ** 0.5, int(replacements))


def measure(settings: dict[str, Any], trials: int) -> dict[str, Any]:
    import random

    from .selection_simulation import selection_study

    equal = selection_study(trials, **settings)
    spread = selection_study(
        trials,
        **settings,
        skill=lambda rng: rng.gauss(0, BETA),
        child_skill=lambda parent, rng: parent + random.Random(rng.random()).gauss(0, BETA),
    )
    return {
        "youngest_share": round(equal["youngest_share"], 3),
        "youngest_share_by_chance": round(equal["youngest_share_by_chance"], 3),
        "youngest_ready_share": round(equal["youngest_ready_share"], 3),
        "youngest_ready_share_by_chance": round(equal["youngest_ready_share_by_chance"], 3),
        "survivor_change_share": round(equal["survivor_change_share"], 3),
        "weakest_share": round(spread["weakest_share"], 3),
        "weakest_share_by_chance": round(spread["weakest_share_by_chance"], 3),
        "replacements": int(equal["replacements_after_first"]),
        "replacements_among_ages": int(equal["replacements_among_ages"]),
        "youngest_ready_mde": _rounded(
            share_mde(equal["youngest_ready_share_by_chance"], equal["replacements_among_ages"])
        ),
        "weakest_mde": _rounded(share_mde(spread["weakest_share_by_chance"], spread["replacements"])),
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _shown(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 simulations per setting")
    ap.add_argument("--trials", type=int, default=None, help="simulations per setting (default 40, quick 2)")
    ap.add_argument("--recipes", nargs="+", default=None, help="recipe files (default: every recipes/*.yaml)")
    args = ap.parse_args()
    trials = args.trials or (2 if args.quick else 40)
    paths = [Path(p) for p in args.recipes] if args.recipes else sorted((REPO / "recipes").glob("*.yaml"))
    rows = []
    measured: dict[tuple[str, str], dict[str, Any]] = {}  # recipes that differ only elsewhere share a simulation
    start = time.perf_counter()
    header = (
        f"{'recipe':<32} {'pop':>5} {'every':>5} {'child':>7}  youngest (chance)  youngest ready (chance, MDE)"
        "  survivors change  weakest (chance, MDE)"
    )
    print(header)
    for path in paths:
        settings = recipe_settings(path)
        if settings is None:
            continue
        evo, key = settings["evolution"], settings.pop("key")
        own = evo.child_rating
        for policy in (own, "widen" if own == "inherit" else "inherit"):
            if (key, policy) not in measured:
                measured[key, policy] = measure(
                    {**settings, "evolution": evo.model_copy(update={"child_rating": policy})}, trials
                )
            result = measured[key, policy]
            row = {
                "recipe": path.name,
                "population": f"{settings['teachers']}T{settings['students']}S",
                "every": evo.every,
                "child_rating": policy,
                "recipe_default": policy == own,
                **result,
            }
            rows.append(row)
            print(
                f"{path.name:<32} {row['population']:>5} {row['every']:>5} {policy:>7}"
                f"  {row['youngest_share']:>8.2f} ({row['youngest_share_by_chance']:.2f})"
                f"  {row['youngest_ready_share']:>14.2f} ({row['youngest_ready_share_by_chance']:.2f}, "
                f"{_shown(row['youngest_ready_mde'])})"
                f"  {row['survivor_change_share']:>16.2f}  {row['weakest_share']:>7.2f} "
                f"({row['weakest_share_by_chance']:.2f}, {_shown(row['weakest_mde'])})",
                file=sys.stdout,
            )
    print(json.dumps({"trials": trials, "seconds": round(time.perf_counter() - start, 1), "rows": rows}))


if __name__ == "__main__":
    main()
