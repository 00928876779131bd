"""``populora plan``: GPU memory per device and disk of a recipe, from the base model's config alone.

No weights are read: config.json is built on the meta device to count parameters per module. The plan composes
what the recipe's engine and trainer report through their registered ``memory=`` functions
(:mod:`populora_core.api.memory`: the built-ins' are in ``populora_engines/memory.py`` and
``populora_trainers/memory.py``) into both phases' peaks per GPU, and adds disk, the verdict and the single
changes that would make it fit. The core keeps no copy of a component's internals; a component without such a
function is planned as holding nothing, with a note.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

from ..api.errors import UserError
from ..api.memory import AUTO_MARGIN, Arch, EngineMemory, PlanContext, TrainerMemory
from ..api.schema import Recipe
from ..recipe.overrides import override_model
from ..services.architecture import config_source, load_arch, parse_memory
from ..services.gpu import GIB, dtype_bytes, visible_gpu_bytes

DEFAULT_PROMPT_TOKENS = 6144  # AZR's max_prompt_length, when neither max_prompt_tokens nor max_model_len bound it


def declared_params(registry: Any, kind: str, ref: Any) -> Any:
    """What a component's ``memory=`` or ``gpus=`` function receives: its params model, parsed, every default
    filled in (an override of a param it does not have changes nothing, as it would be refused at run time), so no
    plugin restates a default. None without a registry, for an unknown component or params that do not validate."""
    raw = dict(ref.params or {})
    try:
        comp = registry.get(kind, ref.name)
    except Exception:
        return None
    fields = set(comp.params_model.model_fields)
    for candidate in (raw, {k: v for k, v in raw.items() if k in fields}):  # as written, then known keys only
        try:
            return comp.parse_params(candidate)
        except Exception:
            continue
    return None


def plan_recipe(
    recipe: Recipe,
    arch: Arch,
    *,
    gpu_bytes: int,
    gpus: int = 1,
    registry: Any = None,
    suggest: bool = True,
    held: int = 0,
    with_trainer: bool = True,
) -> dict[str, Any]:
    """The plan of a typed recipe (what the components' memory functions read): rows per GPU, both phases' peaks,
    disk, verdict and suggestions; each change it tries is an override of that recipe (:func:`override_model`).

    ``held``: bytes of the GPU other processes held when it was measured (a row of their own, in both phases);
    ``with_trainer`` False: the engine alone (``populora eval``: nothing trains on its GPU)."""
    scope: dict[str, Any] = {"held": held, "with_trainer": with_trainer}
    roll, rank = recipe.rollout, recipe.lora.rank
    members = recipe.population.adapters
    per_gpu = math.ceil(members / gpus)
    b = dtype_bytes(arch.dtype if arch.dtype != "auto" else "bfloat16")
    completion = max(roll.propose_max_tokens, roll.solve_max_tokens)

    def longest_row(max_len: int | None) -> int:
        prompt = roll.max_prompt_tokens or (max_len - completion if max_len else DEFAULT_PROMPT_TOKENS)
        return min(completion + max(1, int(prompt)), max_len or arch.max_positions or 1 << 40)

    context = PlanContext(
        arch, recipe, gpu_bytes, gpus, members, per_gpu, rank, longest_row(None), 4 * arch.lora_params(rank), b
    )
    own, engine_notes = component_memory(registry, "engine", recipe.engine, context)
    context = dataclasses.replace(context, seq=longest_row(own.max_len))
    if with_trainer:
        side, trainer_notes = component_memory(registry, "trainer", recipe.trainer, context)
    else:
        side, trainer_notes = TrainerMemory(), ["the engine alone: no trainer shares its GPU"]
    candidates = side.candidates + own.candidates
    if own.auto:
        return _plan_auto(recipe, arch, gpu_bytes, gpus, registry, own.auto, candidates, suggest, scope)
    notes = trainer_notes + side.notes + engine_notes + own.notes
    others = [("other processes", float(held), "held on this GPU when it was measured")] if held else []
    rows = others + side.rows + own.rows + side.update_rows + own.training_rows
    resident = held + side.resident + own.resident
    generation = resident + own.generating
    training = resident + side.update + own.training
    phases = {"generation": generation, "training": training}
    over = [
        f"{k} phase ({v / GIB:.1f} GiB) exceeds {gpu_bytes / GIB:.1f} GiB by {(v - gpu_bytes) / GIB:.1f} GiB"
        for k, v in phases.items()
        if v > gpu_bytes
    ] + ([own.kv_short] if own.kv_short else [])
    peak = max(phases.values())
    result: dict[str, Any] = {
        "recipe": recipe.name,
        "model": arch.source,
        "gpus": gpus,
        "gpu_gib": round(gpu_bytes / GIB, 2),
        "members": members,
        "members_per_gpu": per_gpu,
        "base_params": arch.params,
        "lora_params": arch.lora_params(rank),
        "rows": [{"what": w, "gib": round(v / GIB, 2), "detail": d} for w, v, d in rows],
        "generation_gib": round(generation / GIB, 2),
        "training_gib": round(training / GIB, 2),
        "peak_gib": round(peak / GIB, 2),
        "host_rows": [{"what": w, "gib": round(v / GIB, 2), "detail": d} for w, v, d in side.host_rows + own.host_rows],
        "host_gib": round((side.host + sum(v for _, v, _ in own.host_rows)) / GIB, 2),
        "trainer_side_bytes": side.side_bytes,
        "gradient_checkpointing": side.gradient_checkpointing,
        "disk": _disk(recipe, members, context.adapter_bytes + side.served_copy_bytes, side.member_state_bytes),
        "notes": notes,
        "fits": not over,
        "suggestions": [],
        "verdict": f"fits: peak {peak / GIB:.1f} GiB of {gpu_bytes / GIB:.1f} GiB per GPU",
    }
    if suggest and not over:  # room the engine could use that still fits (vLLM asleep: more KV cache)
        for change in own.roomier:
            trial = override_model(recipe, [change])
            roomy = plan_recipe(trial, arch, gpu_bytes=gpu_bytes, gpus=gpus, registry=registry, suggest=False, **scope)
            if roomy["fits"]:
                notes.append(f"{change.replace('=', ' up to ', 1)} also fits (more room for the engine)")
                break
    if over:
        if suggest:
            result["suggestions"] = _suggestions(recipe, arch, gpu_bytes, gpus, registry, per_gpu, candidates, scope)
        tries = f"; try: {', '.join(result['suggestions'])}" if result["suggestions"] else ""
        result["verdict"] = f"does not fit: {'; '.join(over)}{tries}"
    return result


def _plan_auto(
    recipe: Recipe,
    arch: Arch,
    gpu_bytes: int,
    gpus: int,
    registry: Any,
    auto: dict[str, list[Any]],
    candidates: list[str],
    suggest: bool,
    scope: dict[str, Any],
) -> dict[str, Any]:
    """The plan of the first combination of the engine's ``auto`` values (preferred first) whose peak leaves
    :data:`AUTO_MARGIN` of the GPU free; else of the first that fits at all; else of the last, with the changes
    that make the recipe as written fit (each planned with its own ``auto`` choice)."""
    keys = [f"engine.params.{key}" for key in auto]
    combos = [dict(zip(keys, values)) for values in itertools.product(*auto.values())]

    def planned(combo: dict[str, Any]) -> dict[str, Any]:
        changes = [f"{k}={_value(v)}" for k, v in combo.items()]
        trial = override_model(recipe, changes)
        return plan_recipe(trial, arch, gpu_bytes=gpu_bytes, gpus=gpus, registry=registry, suggest=False, **scope)

    within = fitting = last = None
    for combo in combos:
        last = (combo, planned(combo))
        if last[1]["fits"] and last[1]["peak_gib"] * GIB <= (1 - AUTO_MARGIN) * gpu_bytes:
            within = last
            break
        if last[1]["fits"] and fitting is None:
            fitting = last
    assert last is not None  # an engine offers at least one value per auto param
    combo, result = within or fitting or last
    if within:
        why = f"the engine's first preference that leaves {AUTO_MARGIN:.0%} of the GPU free for reserved memory"
    elif fitting:
        why = f"none leaves {AUTO_MARGIN:.0%} of the GPU free for reserved memory: the first that fits at all"
    else:
        why = "no choice fits"
    result["auto"] = combo
    chosen = ", ".join(f"{k}: auto -> {_value(v)}" for k, v in combo.items())
    result["notes"].insert(0, f"{chosen} ({why})")
    if not result["fits"] and suggest:
        per_gpu = int(result["members_per_gpu"])
        result["suggestions"] = _suggestions(recipe, arch, gpu_bytes, gpus, registry, per_gpu, candidates, scope)
        if result["suggestions"]:
            result["verdict"] += f"; try: {', '.join(result['suggestions'])}"
    return result


def _value(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _suggestions(
    recipe: Recipe,
    arch: Arch,
    gpu_bytes: int,
    gpus: int,
    registry: Any,
    per_gpu: int,
    candidates: list[str],
    scope: dict[str, Any],
) -> list[str]:
    """Single changes that make the recipe fit (``key=value`` overrides or ``--gpus``), else one combination. The
    candidates are the trainer's, then the engine's (each nearest first); of a key offered with several values,
    only the first that fits is suggested."""
    values = Counter(c.split("=", 1)[0] for c in candidates)

    def several(change: str) -> bool:
        return values[change.split("=", 1)[0]] > 1

    def fits(changes: list[str], n: int = gpus) -> bool:
        trial = override_model(recipe, changes)
        planned = plan_recipe(trial, arch, gpu_bytes=gpu_bytes, gpus=n, registry=registry, suggest=False, **scope)
        return bool(planned["fits"])

    found: list[str] = []
    for change in candidates:
        key = change.split("=", 1)[0]
        if not any(f.split("=", 1)[0] == key for f in found) and fits([change]):
            found.append(change)
    if per_gpu > 1 and fits([], 2 * gpus):  # members split over more GPUs
        found.append(f"--gpus {2 * gpus}")
    if found:
        return found[:5]
    others = [c for c in candidates if not several(c)]
    choices = [None, *(c for c in candidates if several(c))]
    for n in (gpus, 2 * gpus):  # no single change: the fewest of the others (in order), with one of the choices
        for i in range(len(others) + 1):
            for choice in choices:
                changes = others[:i] + ([choice] if choice else [])
                if (changes or n > gpus) and fits(changes, n):
                    return [" ".join(changes + ([f"--gpus {n}"] if n > gpus else []))]
    return []


def component_memory(registry: Any, kind: str, ref: Any, context: PlanContext) -> Any:
    """An engine's or trainer's own terms (its registered ``memory=`` function, given its parsed params), and a
    note when it reports none or its params do not validate."""
    empty = EngineMemory() if kind == "engine" else TrainerMemory()
    try:
        report = registry.get(kind, ref.name).meta.get("memory") if registry is not None else None
    except UserError:
        report = None
    if report is None:
        return empty, [f"{kind} {ref.name!r} reports no memory terms (register(..., memory=)): none planned"]
    params = declared_params(registry, kind, ref)
    if params is None:
        return empty, [f"{kind} {ref.name!r}: its params do not validate, so its memory terms are not planned"]
    return report(params, context), []


def _disk(recipe: Any, members: int, adapter: int, state: int) -> dict[str, Any]:
    """Each trained member writes one adapter version per step (``adapter``: its fp32 files and the trainer's
    served copy); ``adapters.keep`` decides what stays."""
    steps, ck, policy = recipe.steps, recipe.checkpoint, recipe.adapters
    keep = policy.keep
    if keep == "all":
        versions = members * (steps + 1)
    else:  # living members' current and first versions, every kept checkpoint's, those since the last prune
        versions = members * (2 + ck.keep + ck.every)
        versions += members * (policy.last - 1) if keep == "last" else 0
    return {
        "adapter_mb": round(adapter / 1e6, 1),
        "per_step_gb": round(members * adapter / 1e9, 3),
        "adapters_kept": keep if "keep" in policy.model_fields_set else "all (the recipe has no adapters.keep)",
        "run_gb": round(versions * adapter / 1e9, 1),  # children of evolution add a version each
        "checkpoints_gb": round((ck.keep + 1) * members * state / 1e9, 1),
    }


def plan_file(
    recipe: str,
    overrides: Any,
    manager: Any,
    *,
    gpus: int | None = None,
    gpu_memory: str | None = None,
    config: str | None = None,
) -> dict[str, Any]:
    """``populora plan``: check the flags, load and validate the recipe, find its model config, plan it."""
    from ..recipe.validate import load_recipe

    if gpus is not None and gpus < 1:
        raise UserError(f"--gpus: {gpus} is not a GPU count (1 or more)")
    gpu_bytes, gpu_from = gpu_budget(gpu_memory)
    if config is not None and not Path(config).is_file():
        raise UserError(f"--config: {config} is not a file")
    model, _ = load_recipe(recipe, list(overrides), manager.registry)
    return plan_loaded(model, manager.registry, recipe, gpu_bytes, gpu_from, gpus=gpus, config=config)


def gpu_budget(gpu_memory: str | None) -> tuple[int, str]:
    """(bytes per GPU, where that figure came from): ``--gpu-memory``, else the visible GPU, else the assumed one."""
    if gpu_memory is not None:
        return parse_memory(gpu_memory), "--gpu-memory"
    visible = visible_gpu_bytes()
    return (visible, "this GPU") if visible else (ASSUMED_GPU_BYTES, "assumed")


def plan_loaded(
    model: Recipe,
    registry: Any,
    recipe: str | None,
    gpu_bytes: int,
    gpu_from: str,
    *,
    gpus: int | None = None,
    config: str | None = None,
) -> dict[str, Any]:
    """The plan of an already loaded recipe (``populora plan``, ``populora run --dry-run``). ``gpus`` None: the
    GPUs the recipe's cluster reserves (its registered ``gpus=`` function), else 1."""
    gpus_from = "--gpus"
    if gpus is None:
        gpus, gpus_from = cluster_gpus(registry, model.cluster)
    result = plan_model(model, registry, recipe, gpu_bytes, gpus, config)
    result["gpu_memory_from"], result["gpus_from"] = gpu_from, gpus_from
    return result


def cluster_gpus(registry: Any, ref: Any) -> tuple[int, str]:
    """(GPUs the members are spread over, where that figure came from): the recipe's cluster's own count (a cluster
    registers ``gpus=fn(params) -> int``), else the one GPU of a single process."""
    name = ref.name
    try:
        count = registry.get("cluster", name).meta.get("gpus") if name != "local" else None
    except UserError:
        count = None
    if count is None:
        return 1, "one process" if name == "local" else f"cluster {name!r} reports no GPU count"
    params = declared_params(registry, "cluster", ref)
    if params is None:
        return 1, f"cluster {name!r}: its params do not validate"
    return max(1, int(count(params))), f"cluster {name!r}"


def plan_model(
    model: Recipe,
    registry: Any,
    recipe: str | None,
    gpu_bytes: int,
    gpus: int = 1,
    config: Any = None,
    held: int = 0,
) -> dict[str, Any]:
    ref = model.base_model
    source = Path(config) if config else config_source(ref.name, registry, recipe, ref.params)
    registered = ref.name in registry.names("base_model")
    dtype = registry.base_model(ref.name, ref.params).dtype if registered else "auto"
    arch = load_arch(source, list(model.lora.target_modules), dtype)
    return plan_recipe(model, arch, gpu_bytes=gpu_bytes, gpus=gpus, registry=registry, held=held)


def plan_engine_alone(
    name: str, params: dict[str, Any], base_model: Any, lora: Any, registry: Any, gpu_bytes: int, held: int = 0
) -> dict[str, Any]:
    """The plan of engine ``name`` alone on one GPU (``populora eval``: nothing trains beside it), from its base
    model's config.json; ``held``: what other processes hold there."""
    arch = load_arch(Path(base_model.path) / "config.json", list(lora.target_modules), base_model.dtype)
    recipe = Recipe.model_validate(
        {
            "name": "engine-alone",  # a plan's name, never a folder; it must still be a safe run name
            "steps": 1,
            "base_model": base_model.name or base_model.path,
            "engine": {"name": name, "params": dict(params)},
            "lora": {"rank": lora.rank},
            "population": {"mode": "single_agent", "teachers": 1, "students": 1},
        }
    )
    return plan_recipe(recipe, arch, gpu_bytes=gpu_bytes, registry=registry, held=held, with_trainer=False)


#: the GPU a plan is made for when none is visible and --gpu-memory is not given (an A100/H100 80 GB)
ASSUMED_GPU_BYTES = 80 * GIB
