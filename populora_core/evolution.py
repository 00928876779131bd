"""How adapters come to be: fresh ones at step 0, then children of survivors made by weight-space operators.

:func:`apply_operator` is the one checked way to make a child, used by the loop and by ``populora evolve``:
it checks the parents' count against the operator's declared arity and their shapes against each other,
runs the operator with a seeded generator, and checks that the child has the parents' rank, alpha, target
modules and shapes before anything saves it. torch is imported inside functions only.
"""

from __future__ import annotations

import random
import warnings
from typing import TYPE_CHECKING, Any

from .adapters import LoraWeights, check_compatible, fresh_lora, load_lora, save_lora, shape_difference
from .components import Replacement
from .errors import PluginError, UserError
from .population import Lineage, Member, Rating
from .registry import Component, Params, accepted_arguments
from .rng import derived_rng, derived_seed

if TYPE_CHECKING:
    from .loop import Run


def operator_arity(component: Component) -> tuple[int, int | None]:
    """(fewest, most) parents an operator takes, as registered: ``min_parents=``, ``max_parents=`` (None: no bound)."""
    meta = component.meta
    if "min_parents" not in meta and "parents" in meta:  # plugin API 1: parents=N exactly, 0/None any number
        warnings.warn(
            f"operator {component.name!r} (plugin {component.plugin}) registers parents={meta['parents']!r}: "
            "since plugin API 2 write min_parents= and max_parents= (parents= is read until plugin API 3)",
            FutureWarning,
            stacklevel=2,
        )
        n = meta["parents"]
        return (int(n), int(n)) if n else (2, None)
    if "min_parents" not in meta:
        raise PluginError(
            f"operator {component.name!r} (plugin {component.plugin}) does not declare how many parents it takes "
            "(register it with min_parents= and max_parents=)"
        )
    low, high = int(meta["min_parents"]), meta.get("max_parents")
    high = None if high is None else int(high)
    if low < 1 or (high is not None and high < low):
        raise PluginError(f"operator {component.name!r} (plugin {component.plugin}): bad arity {low}..{high}")
    return low, high


def arity_text(component: Component) -> str:
    low, high = operator_arity(component)
    if high is None:
        return f"{low} or more"
    return f"exactly {low}" if low == high else f"{low} to {high}"


def apply_operator(component: Component, params: Params, parents: list[LoraWeights], seed: int) -> LoraWeights:
    """One child of ``parents`` (best first) by ``component``, checked before anyone saves it."""
    import torch

    low, high = operator_arity(component)
    if len(parents) < low or (high is not None and len(parents) > high):
        raise UserError(f"operator {component.name!r} takes {arity_text(component)} parent(s), got {len(parents)}")
    check_compatible(parents)
    child = component.factory(parents, params, torch.Generator().manual_seed(int(seed)))
    check_child(component, parents[0], child)
    return child


def check_child(component: Component, parent: LoraWeights, child: Any) -> None:
    """A child keeps its parents' rank, alpha, target modules and every module's shapes."""
    where = f"operator {component.name!r} (plugin {component.plugin})"
    if not isinstance(child, LoraWeights):
        raise PluginError(f"{where} returned {type(child).__name__}, not LoraWeights")
    diff = shape_difference(parent, child, arrow="->")
    if diff is not None:
        raise PluginError(f"{where} changed {diff}")


def initialise(run: Run) -> None:
    """Fresh adapters (version 0) for every member, from the base model's module shapes, with lineage."""
    for i, member in enumerate(run.population.members.values()):
        member_seed = derived_seed(run.recipe.seed, 0, f"init/{i}")
        weights = fresh_lora(run.base_model.path, run.lora, seed=member_seed)
        save_lora(weights, run.dir.adapter_path(member.version_name))
        member.lineage = Lineage(operator="init", seed=member_seed)
    run.dir.append(
        "lineage.jsonl",
        [
            {
                "step": 0,
                "child": m.version_name,
                "member": m.id,
                "role": m.role,
                "parents": [],
                "operator": "init",
                "params": {},
                "seed": m.lineage.seed,
            }
            for m in run.population.members.values()
        ],
    )


def ready_ids(members: list[Member], step: int, readiness: int) -> set[str]:
    """PBT's readiness: the members that have lived ``readiness`` steps and so may be replaced at ``step``."""
    return {m.id for m in members if step - m.born_step >= readiness}


def child_rating(parent: Rating, policy: str) -> Rating:
    """A child's first rating. ``inherit``: its first parent's mu and sigma, so mu - k*sigma compares it with the
    veterans like with like (a child is a small step from its parent in weight space); ``fresh``: the prior."""
    return Rating(parent.mu, parent.sigma) if policy == "inherit" else Rating()


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


def evolve(run: Run, step: int) -> list[dict[str, Any]]:
    """Selection and replacement per sub-population; returns the lineage records of the children."""
    assert run.selector is not None
    run.hook.before_evolution(run=run, step=step, population=run.population)
    rng = derived_rng(run.recipe.seed, step, "evolution")
    evo = run.recipe.evolution
    events: list[dict[str, Any]] = []
    for role, group in sorted(run.population.subpopulations().items()):
        if role not in evo.subpopulations or len(group) < 2:
            continue
        for rep in select(run.selector, group, rng, ready_ids(group, step, evo.readiness)):
            events.append(_replace(run, step, rep, rng))
    run.dir.append("lineage.jsonl", events)
    run.emit([{"event": "evolution", **e} for e in events])
    run.hook.after_evolution(run=run, step=step, events=events)
    return events


def _replace(run: Run, step: int, rep: Replacement, rng: random.Random) -> dict[str, Any]:
    """``rep.dead`` leaves; a child of ``rep.parents`` by a drawn (or the named) operator takes its place."""
    component, params = _choose_operator(run, rep, rng)
    _, most = operator_arity(component)
    available = rep.parents[:1] if rep.mutation_only else rep.parents
    parents: list[Member] = [run.population.members[p] for p in available[:most]]
    op_seed = rng.randrange(2**31)
    child_weights = apply_operator(
        component, params, [load_lora(run.dir.adapter_path(p.version_name)) for p in parents], op_seed
    )
    dead = run.population.remove(rep.dead)
    params_dict = params.model_dump(mode="json")
    child = run.population.add_new(
        dead.id.rstrip("0123456789"),
        dead.role,
        born_step=step,
        lineage=Lineage([p.version_name for p in parents], component.name, params_dict, op_seed, step),
    )
    child.rating = child_rating(parents[0].rating, run.recipe.evolution.child_rating)
    save_lora(child_weights, run.dir.adapter_path(child.version_name))
    if run.recipe.evolution.child_optimizer == "inherit":
        run.trainer.copy_state(parents[0].id, child.id)
    run.trainer.forget(dead.id)
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


def _choose_operator(run: Run, rep: Replacement, rng: random.Random) -> tuple[Component, Params]:
    """The selector's named operator, else one drawn by weight among the recipe's that fit the parents."""
    if rep.operator:
        component = run.manager.registry.get("operator", rep.operator)
        return component, component.parse_params(rep.params)
    available = 1 if rep.mutation_only else len(rep.parents)
    fits = [(c, p, w) for c, p, w in run.operators if operator_arity(c)[0] <= available]
    if not fits:
        raise UserError(
            "evolution: no operator in the recipe's mix fits "
            f"{len(rep.parents)} parent(s){' (mutation only)' if rep.mutation_only else ''}; "
            "add a mutation operator to evolution.operators"
        )
    component, params, _ = rng.choices(fits, weights=[w for _, _, w in fits])[0]
    return component, params
