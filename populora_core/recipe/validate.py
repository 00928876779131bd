"""Recipes: YAML validated in two passes, ``key.sub=value`` overrides, JSON Schema.

Pass 1 checks the recipe's own structure (unknown keys are errors). Pass 2 resolves every component
reference through the registry and validates its params against the providing plugin's model.
Every error names the recipe file, the YAML path, the component and its plugin.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..api.errors import PluginError, RecipeError, UserError
from ..api.params import format_validation_error
from ..api.schema import Recipe
from ..plugin.registry import Registry
from .overrides import apply_overrides, load_yaml


def parse_recipe(data: dict[str, Any], registry: Registry | None, recipe: str = "<recipe>") -> Recipe:
    """Both validation passes; ``registry=None`` runs only the structural pass."""
    try:
        parsed = Recipe.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise RecipeError(format_validation_error(err, model=Recipe), recipe=recipe, path=path) from None
    _check_evolution(parsed, recipe)
    if registry is not None:
        validate_components(parsed, registry, recipe)
        _check_survivors(parsed, registry, recipe)
        _check_rollout_logprobs(parsed, registry, recipe)
    return parsed


def _check_evolution(parsed: Recipe, recipe: str) -> None:
    """Evolution settings under which selection could never compare two members are errors, not silent no-ops."""
    evo, pop = parsed.evolution, parsed.population
    if not evo.every or pop.single_agent:
        return  # the single agent never evolves (one adapter per slot plays both roles)
    sizes = {"teacher": pop.teachers, "student": pop.students, "both": 0}
    if all(sizes[role] < 2 for role in evo.subpopulations):
        raise RecipeError(
            f"evolution.every is {evo.every} but no sub-population in evolution.subpopulations "
            f"({', '.join(evo.subpopulations) or 'none'}) has two members to compare "
            f"(teachers {pop.teachers}, students {pop.students}); set evolution.every: 0 to run without evolution",
            recipe=recipe,
            path="evolution.every",
        )
    last = (parsed.steps - 1) // evo.every * evo.every  # the last step that evolves (a last-step child never trains)
    # most rated matches a member plays by then: a teacher one a step, a student one per teacher
    most = max(last * (1 if role == "teacher" else pop.teachers) for role in evo.subpopulations if sizes[role] >= 2)
    if last >= evo.every and evo.readiness > most:
        raise RecipeError(
            f"evolution.ready_after is {evo.readiness} rated matches but the last replacement happens at step {last} "
            f"(every {evo.every}, {parsed.steps} steps), when a member has played at most {most}: no member could "
            "ever be replaced; lower ready_after",
            recipe=recipe,
            path="evolution.ready_after",
        )


def evolution_warning(parsed: Recipe) -> str | None:
    """Why evolution will make no child in this run, with the smallest ``steps`` that makes one; None when it can.

    Selection runs at every ``evolution.every``-th step before the last (a last-step child would never train) and
    replaces only members that have played ``ready_after`` rated matches: a teacher plays one a step, a student on
    average teachers/students a step (one per teacher that drew it, when that teacher's problem was valid). A run
    too short for that is valid, but a newcomer's operator plugin would never be called, so it is said."""
    evo, pop = parsed.evolution, parsed.population
    if not evo.every or pop.single_agent:
        return None
    rates = {"teacher": Fraction(1), "student": Fraction(pop.teachers, max(pop.students, 1))}
    sizes = {"teacher": pop.teachers, "student": pop.students}
    evolving = [role for role in evo.subpopulations if role in sizes and sizes[role] >= 2]
    if not evolving:
        return None  # _check_evolution's error
    rate = max(rates[role] for role in evolving)
    # the first selection at which a member of the fastest role has played ready_after matches
    first = evo.every * max(1, math.ceil(Fraction(evo.readiness) / rate / evo.every))
    if first < parsed.steps:
        return None
    selections = list(range(evo.every, parsed.steps, evo.every))
    at = f"at step {', '.join(map(str, selections))}" if selections else "at no step: the last step's is left out"
    student = f"{float(rates['student']):g}"
    return (
        f"evolution will make no child in {parsed.steps} steps: selection runs every {evo.every} steps before the last "
        f"({at}) and replaces only members that have played {evo.readiness} rated matches (evolution.ready_after; a "
        f"teacher plays 1 a step, a student about {student}), first reached at step {first}; steps={first + 1} or more "
        "makes a child (or lower evolution.every or evolution.ready_after)"
    )


def _check_survivors(parsed: Recipe, registry: Registry, recipe: str) -> None:
    """Each evolving role keeps at least two lines through a selection: with one, every replacement makes the
    whole role one parent's descendants."""
    evo, pop = parsed.evolution, parsed.population
    if not evo.every or pop.single_agent:
        return
    selector = registry.get("selector", evo.selector.name).build(evo.selector.build_params())
    survivors = getattr(selector, "survivors", None)
    for role, n in (("teacher", pop.teachers), ("student", pop.students)):
        if role not in evo.subpopulations or n < 2 or survivors is None:
            continue
        kept = survivors(n)
        if kept is not None and kept < 2:
            raise RecipeError(
                f"selector {evo.selector.name!r} with {evo.selector.params or 'its defaults'} replaces "
                f"{n - kept} of the {n} {role}s at each selection and keeps {kept} line(s): the {role}s would fall "
                f"back to one lineage every time. Each role needs 2 survivors: raise population.{role}s "
                f"(4 with a fraction of 0.25), replace a smaller fraction, or leave {role} out of "
                "evolution.subpopulations",
                recipe=recipe,
                path="evolution.selector.params",
            )


def _check_rollout_logprobs(parsed: Recipe, registry: Registry, recipe: str) -> None:
    """A trainer that reads the engine's log-probs as its old policy (``sampling_logprobs=``: grpo's
    ``use_rollout_logprobs``) divides its own log-probs by them: sampling that makes the two differ biases every
    importance ratio. top-p renormalises the engine's over the nucleus it samples from, the trainer's cover the whole
    vocabulary; another temperature scales one and not the other."""
    ref = parsed.trainer
    component = registry.get("trainer", ref.name)
    reads = component.meta.get("sampling_logprobs")
    params = ref.build_params()
    if reads is None or not reads(params):
        return
    rollout = parsed.rollout
    where = {"recipe": recipe, "component": f"trainer {ref.name!r}", "plugin": component.plugin}
    off = (
        "trainer.params.use_rollout_logprobs: false (the trainer computes the old log-probs itself)"
        if hasattr(params, "use_rollout_logprobs")
        else "a trainer that computes the old log-probs itself"
    )
    if rollout.top_p < 1:
        raise RecipeError(
            f"rollout.top_p is {rollout.top_p}, and trainer {ref.name!r} reads the engine's log-probs as its old "
            "policy: the engine's are renormalised over the top-p nucleus, the trainer's cover the whole vocabulary, "
            f"so every importance ratio is biased; set rollout.top_p: 1, or {off}",
            path="rollout.top_p",
            **where,
        )
    temperature = getattr(params, "temperature", None)
    if temperature is not None and float(temperature) != float(rollout.temperature):
        raise RecipeError(
            f"rollout.temperature is {rollout.temperature} and trainer.params.temperature {temperature}, and trainer "
            f"{ref.name!r} reads the engine's log-probs (sampled at {rollout.temperature}) as its old policy against "
            f"its own (at {temperature}): every importance ratio is biased; set them equal, or {off}",
            path="trainer.params.temperature",
            **where,
        )


def _misspelled_base_model(name: str, registered: Iterable[str]) -> str | None:
    """The registered name a bare, unknown base model name is close to (``nanoo`` -> ``nano``), else None.

    Only a name with no ``/`` that is no local path counts: such a name would go to the hub as a legacy id
    and fail there with download advice for the typo."""
    if "/" in name or Path(name).expanduser().exists():
        return None
    close = difflib.get_close_matches(name, list(registered), n=1, cutoff=0.75)
    return close[0] if close else None


def validate_components(recipe_model: Recipe, registry: Registry, recipe: str) -> None:
    """Second pass: each component exists and its params fit its plugin's model."""
    for path, kind, ref in recipe_model.component_refs():
        if kind == "base_model" and ref.name not in registry.names("base_model"):
            if ref.params:
                raise RecipeError(
                    "params are only accepted for a registered base model",
                    recipe=recipe,
                    path=f"{path}.params",
                    component=ref.name,
                )
            near = _misspelled_base_model(ref.name, registry.names("base_model"))
            if near is not None:
                raise RecipeError(
                    f"base model {ref.name!r} is not a registered name ({', '.join(registry.names('base_model'))})"
                    f" nor a local directory: did you mean {near!r}? (a hub id is written org/name)",
                    recipe=recipe,
                    path=f"{path}.name",
                )
            continue  # a local path or hub id, resolved when the run starts
        try:
            component = registry.get(kind, ref.name)
        except UserError as exc:
            raise RecipeError(str(exc), recipe=recipe, path=f"{path}.name") from None
        try:
            ref._parsed = component.parse_params(ref.params)
        except ValidationError as err:
            raise RecipeError(
                format_validation_error(err, prefix=f"{path}.params", model=component.params_model),
                recipe=recipe,
                path=f"{path}.params",
                component=f"{kind} {ref.name!r}",
                plugin=component.plugin,
            ) from None
        if kind == "operator":
            _check_operator(component, ref.name, recipe, path)


def _check_operator(component: Any, name: str, recipe: str, path: str) -> None:
    from ..api.operators import operator_arity

    try:
        operator_arity(component)
    except PluginError as exc:
        raise RecipeError(str(exc), recipe=recipe, path=path, component=f"operator {name!r}") from None


def load_recipe(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), registry: Registry | None = None
) -> tuple[Recipe, dict[str, Any]]:
    """Read, override and validate a recipe file; returns the model and the resolved raw dict."""
    data = apply_overrides(load_yaml(path), overrides, recipe=str(path))
    try:
        model = parse_recipe(data, registry, recipe=str(path))
    except RecipeError as exc:
        blamed = _override_at(exc, overrides)
        if blamed is None:
            raise
        where = f"override {blamed} (on {path})"
        raise RecipeError(exc.detail, recipe=where, path=exc.path, component=exc.component, plugin=exc.plugin) from None
    return model, model.model_dump(mode="json")


def check_files(model: Recipe, recipe: str, overrides: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every file a recipe names for its run exists and can be read: ``probe.file``, ``seeds.file``,
    ``population.init_from`` (a run directory or a folder of PEFT adapter folders). ``populora validate`` and the
    start check them before a run directory exists: a run that fails on one later leaves a run directory that
    ``resume`` cannot mend (the key may not change) and ``run`` will not reuse. Returns warnings: the
    ``eval.data`` files, which only ``populora eval`` reads."""
    import os

    named: list[tuple[str, str, str]] = []
    if model.probe.enabled and model.probe.file:
        named.append(("probe.file", model.probe.file, "file"))
    if model.seeds.enabled and model.seeds.file:
        named.append(("seeds.file", model.seeds.file, "file"))
    if model.population.init_from:
        named.append(("population.init_from", model.population.init_from, "folder"))
    for key, value, kind in named:
        path = Path(value).expanduser()
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        neither = f"{value} is neither a run directory nor a folder of adapters"
        if not path.exists():
            problem = f"{neither}: it does not exist{where}" if kind == "folder" else f"{value} does not exist{where}"
        elif kind == "file" and not path.is_file():
            problem = f"{value} is not a file"
        elif kind == "folder" and not path.is_dir():
            problem = f"{neither}: it is a file"
        elif not os.access(path, os.R_OK | (os.X_OK if kind == "folder" else 0)):
            problem = f"{value} is not readable"
        elif kind == "folder" and not (
            (path / "members.json").is_file() or any((p / "adapter_config.json").is_file() for p in path.iterdir())
        ):
            problem = f"{neither} (no members.json, no PEFT adapter folder in it)"
        else:
            continue
        blamed = next((o for o in reversed(overrides) if o.partition("=")[0] == key), None)
        raise RecipeError(
            f"{key}: {problem}", recipe=f"override {blamed} (on {recipe})" if blamed else recipe, path=key
        )
    return [
        f"eval.data.{name}: {value} does not exist (`populora eval` reads it)"
        for name, value in sorted(model.eval.data.items())
        if not Path(value).expanduser().exists()
    ]


def _override_at(exc: RecipeError, overrides: list[str] | tuple[str, ...]) -> str | None:
    """The override that set the key a recipe error is about (the most specific one), if any: the error then names
    it, not the recipe file, which may hold a good value there."""
    head = exc.detail.split(":", 1)[0]
    where = head if head and " " not in head else (exc.path or "")
    if not where:
        return None
    hits = [
        o
        for o in overrides
        if (key := o.partition("=")[0]) == where or where.startswith(key + ".") or key.startswith(where + ".")
    ]
    return max(hits, key=lambda o: len(o.partition("=")[0]), default=None)
