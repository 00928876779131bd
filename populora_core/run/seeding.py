"""AZR's seeding stage: the base model, with no adapter, proposes problems until every task has N valid ones.

AZR runs it once per base model and ships the result (256 I/O triplets and 256 induction problems per model,
``azr.seed_dataset``); a recipe loads such a file with ``seeds.enabled``. Each round asks every task that is
still short for proposer prompts whose references come from that task's buffer, which fills with the seeds
found so far, so later rounds see more varied references (AZR's loop does the same). Induction prompts draw
their programs from the deduction and abduction buffers, so they diversify as those fill.
Differences from AZR: each task keeps the seeds its own proposer prompt produced (AZR pools deduction- and
abduction-style seeds into both buffers), and programs are not stripped of comments or globals.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from ..api.components import GenerationRequest, Problem
from ..api.errors import UserError

if TYPE_CHECKING:
    from .assembly import Components


def make_seed_problems(
    c: Components,
    per_type: int,
    *,
    prompts_per_round: int = 32,
    max_rounds: int = 40,
    on_round: Callable[[int, dict[str, int]], None] | None = None,
) -> list[Problem]:
    """Valid, distinct (by the task's ``problem_key``) base-model proposals: ``per_type`` of every task type of the
    run's components."""
    if per_type < 1:
        raise UserError(f"seeding: per-type count must be at least 1, got {per_type}")
    found: dict[str, list[Problem]] = {name: [] for name in c.tasks}
    seen: set[tuple[str, Hashable]] = set()
    cfg = c.recipe.rollout
    for round_ in range(1, max_rounds + 1):
        requests, origin = [], []
        for name, task in c.tasks.items():
            if len(found[name]) >= per_type:
                continue
            rng = c.streams.rng(round_, f"seed/{name}")
            for prompt, ctx in task.proposer_prompts(prompts_per_round, rng):
                requests.append(GenerationRequest(prompt, None))
                origin.append((name, ctx))
        if not requests:
            break
        outputs = c.engine.generate(requests, c.sampling(round_, "sample/seed", n=1, max_tokens=cfg.propose_max_tokens))
        problems = c.parse_proposals(
            [completions[0].text for completions in outputs],
            [name for name, _ in origin],
            [ctx for _, ctx in origin],
            ["base"] * len(origin),
        )
        fresh: dict[str, list[Problem]] = {name: [] for name in c.tasks}
        for (name, _), problem in zip(origin, problems):
            key = (name, c.tasks[name].problem_key(problem))
            if problem.valid and key not in seen and len(found[name]) + len(fresh[name]) < per_type:
                seen.add(key)
                fresh[name].append(problem)
        for name, task in c.tasks.items():
            found[name] += fresh[name]
            task.add_to_buffer(fresh[name])
        if on_round is not None:
            on_round(round_, {name: len(v) for name, v in found.items()})
    short = {name: len(v) for name, v in found.items() if len(v) < per_type}
    if short:
        raise UserError(
            f"seeding: after {max_rounds} rounds some tasks are short of {per_type} valid seeds: "
            + ", ".join(f"{n} {c}" for n, c in short.items())
            + " (raise --max-rounds or lower --per-type)"
        )
    return [p for problems in found.values() for p in problems]
