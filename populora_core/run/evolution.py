"""The run's evolution step: fresh adapters at step 0, then, every ``evolution.every`` steps, selection per
sub-population and children of survivors in their place, with lineage. Private to the loop; what plugins and
``populora evolve`` use lives in :mod:`.operators`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.components import Replacement
from ..api.errors import UserError
from ..api.operators import child_rating, operator_arity, ready_ids, select
from ..api.params import Component, Params
from ..api.population import Lineage, Member, Population
from ..services.adapters import fresh_lora, load_lora, save_lora, shape_difference
from ..services.operators import apply_operator

if TYPE_CHECKING:
    from .assembly import Components


def initialise(c: Components, population: Population) -> None:
    """Version 0 of every member, with lineage: fresh adapters from the base model's module shapes, or the
    recipe's ``population.init_from`` adapters."""
    sources = init_sources(c.recipe.population.init_from, list(population.members.values()))
    for i, member in enumerate(population.members.values()):
        member_seed = c.streams.seed_for(0, f"init/{i}")
        weights = fresh_lora(c.base_model.path, c.lora, seed=member_seed)
        if sources:
            source = sources[member.id]
            loaded = load_lora(source)
            diff = shape_difference(weights, loaded, arrow="->")
            if diff is not None:
                raise UserError(f"population.init_from: {source} does not fit the recipe's lora ({diff})")
            weights = loaded
        save_lora(weights, c.run_dir.adapter_path(member.version_name))
        member.lineage = (
            Lineage([], "init_from", {"from": str(sources[member.id])})
            if sources
            else Lineage(operator="init", seed=member_seed)
        )
    c.run_dir.append(
        "lineage.jsonl",
        [
            {
                "step": 0,
                "child": m.version_name,
                "member": m.id,
                "role": m.role,
                "parents": [],
                "operator": m.lineage.operator,
                "params": dict(m.lineage.params),
                "seed": m.lineage.seed,
            }
            for m in population.members.values()
        ],
    )


def init_sources(init_from: str | None, members: list[Member]) -> dict[str, Path]:
    """Member id -> the adapter folder it starts from ({} without ``init_from``): a run directory's current members
    of each role in turn (a single-agent run's members serve both roles), else the PEFT folders under a folder."""
    if not init_from:
        return {}
    root = Path(init_from)
    if (root / "members.json").is_file():
        recorded = json.loads((root / "members.json").read_text())["members"]
        pick = {
            role: [root / "adapters" / f"{m['id']}@v{m['version']}" for m in recorded if m["role"] in (role, "both")]
            for role in ("teacher", "student")
        }
    elif root.is_dir():
        folders = sorted(p for p in root.iterdir() if (p / "adapter_config.json").is_file())
        pick = {"teacher": folders, "student": folders}
    else:
        raise UserError(f"population.init_from: {init_from} is neither a run directory nor a folder of adapters")
    sources: dict[str, Path] = {}
    for role, available in pick.items():
        mine = [m for m in members if m.role == role or (m.role == "both" and role == "teacher")]
        if mine and not available:
            raise UserError(f"population.init_from: {init_from} holds no {role} adapters (nor PEFT folders)")
        for k, member in enumerate(mine):
            sources[member.id] = available[k % len(available)]
    return sources


def evolve(c: Components, population: Population, step: int) -> list[dict[str, Any]]:
    """Selection and replacement per sub-population of ``population`` (changed in place); returns the lineage
    records of the children."""
    assert c.selector is not None
    rng = c.streams.rng(step, "evolution")
    evo = c.recipe.evolution
    events: list[dict[str, Any]] = []
    for role, group in sorted(population.subpopulations().items()):
        if role not in evo.subpopulations or len(group) < 2:
            continue
        for rep in select(c.selector, group, rng, ready_ids(group, evo.readiness)):
            events.append(_replace(c, population, step, rep, rng))
    return events


def _replace(c: Components, population: Population, step: int, rep: Replacement, rng: random.Random) -> dict[str, Any]:
    """``rep.dead`` leaves; a child of ``rep.parents`` by a drawn (or the named) operator takes its place."""
    component, params = _choose_operator(c, rep, rng)
    _, most = operator_arity(component)
    available = rep.parents[:1] if rep.mutation_only else rep.parents
    parents: list[Member] = [population.members[p] for p in available[:most]]
    op_seed = rng.randrange(2**31)
    child_weights = apply_operator(
        component, params, [load_lora(c.run_dir.adapter_path(p.version_name)) for p in parents], op_seed
    )
    dead = population.remove(rep.dead)
    params_dict = params.model_dump(mode="json")
    child = population.add_new(
        dead.id.rstrip("0123456789"),
        dead.role,
        born_step=step,
        lineage=Lineage([p.version_name for p in parents], component.name, params_dict, op_seed, step),
    )
    evo = c.recipe.evolution
    child.rating = child_rating(
        [p.rating for p in parents], evo.child_rating, evo.child_sigma, prior=c.matchmaker.prior()
    )
    save_lora(child_weights, c.run_dir.adapter_path(child.version_name))
    if c.recipe.evolution.child_optimizer == "inherit":
        c.trainer.copy_state(parents[0].id, child.id)
    c.trainer.forget(dead.id)
    return {
        "step": step,
        "child": child.version_name,
        "member": child.id,
        "role": child.role,
        "replaced": dead.id,
        "parents": [p.version_name for p in parents],
        "operator": component.name,
        "params": params_dict,
        "seed": op_seed,
        "rank": child_weights.rank,
    }


def _choose_operator(c: Components, rep: Replacement, rng: random.Random) -> tuple[Component, Params]:
    """The selector's named operator, else one drawn by weight among the recipe's that fit the parents."""
    if rep.operator:
        component = c.registry.get("operator", rep.operator)
        return component, component.parse_params(rep.params)
    available = 1 if rep.mutation_only else len(rep.parents)
    fits = [(op, p, w) for op, p, w in c.operators if operator_arity(op)[0] <= available]
    if not fits:
        raise UserError(
            "evolution: no operator in the recipe's mix fits "
            f"{len(rep.parents)} parent(s){' (mutation only)' if rep.mutation_only else ''}; "
            "add a mutation operator to evolution.operators"
        )
    component, params, _ = rng.choices(fits, weights=[w for _, _, w in fits])[0]
    return component, params
