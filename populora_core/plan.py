"""``populora plan``: GPU memory per device and disk of a recipe, from the base model's config alone.

No weights are read: config.json is built on the meta device to count parameters per module. The terms
follow what the built-in components allocate: the trainer (populora_trl) keeps the base, every member's
AdamW moments and one scratch adapter; the hf engine shares the trainer's base, vllm holds its own copy,
LoRA slots and a KV cache inside ``gpu_memory_utilization``. Decoder activations are the tensors autograd
keeps per token and layer (PEFT casts a bf16 base's inputs to its fp32 adapters, so those copies count).
tests/test_plan.py checks the trainer-side terms against peaks measured on CPU; vLLM's KV cache is what its
own start-up profile decides, estimated here.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from .architecture import GIB, Arch, config_source, dtype_bytes, load_arch, parse_memory
from .errors import UserError
from .memory import EngineMemory, PlanContext

CUDA_CONTEXT = GIB // 2  # per process, outside torch's allocator (CUDA context, cuBLAS workspaces)
BACKWARD_FACTOR = 1.5  # one layer's saved tensors plus the gradients alive while autograd walks through it
# bytes per vocab logit besides the logits: in one piece autograd keeps the fp32 log-softmax and probs (entropy)
# and makes two gradients; populora_trl's recomputed chunks hold the log-softmax, probs and one gradient
LOGIT_BYTES, CHUNKED_LOGIT_BYTES = 16, 12
_SHARED_INPUT = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"})  # modules that read one tensor
DEFAULT_PROMPT_TOKENS = 6144  # AZR's max_prompt_length, when neither max_prompt_tokens nor max_model_len bound it
#: trainer params the plan reads, and what it assumes of a trainer that does not declare one (no such feature)
ABSENT: dict[str, Any] = {"micro_batch_tokens": None, "gradient_checkpointing": "off", "logprob_chunk_tokens": None}


def component_params(registry: Any, kind: str, ref: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A component's params with its defaults filled in, and the names its params model declares."""
    raw = dict(ref.get("params") or {})
    try:
        comp = registry.get(kind, ref["name"])
        fields = set(comp.params_model.model_fields)
        return {**comp.parse_params({k: v for k, v in raw.items() if k in fields}).model_dump(), **raw}, fields
    except Exception:  # no registry, an unknown component, or params that do not validate: read them raw
        return raw, set(raw)


def layer_bytes_per_token(arch: Arch, b: int, rank: int, masked: bool) -> int:
    """Bytes autograd keeps per token and decoder layer when LoRA (fp32) trains on a base of ``b`` bytes."""
    h, i, f = arch.hidden, arch.intermediate, 4
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    inputs = {k: d_in for k, (_, d_in, _) in arch.targets.items()}
    if b == f:  # no cast to the adapters' dtype: modules that read one tensor share it
        for group in _SHARED_INPUT:
            for k in sorted(group & set(inputs))[1:]:
                inputs.pop(k)
    lora = (sum(inputs.values()) + len(arch.targets) * rank) * f  # LoRA inputs and A outputs, fp32
    attention = (2 * q + 2 * (q if masked else kv)) * b  # q, k, v (repeated for GQA under a mask), output
    return lora + 2 * h * 4 + attention + 3 * i * b  # + RMSNorms' fp32 inputs + gate, silu(gate), up


def trainer_terms(arch: Arch, data: dict[str, Any], trainer: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    """Bytes of the trainer's side: LoRA, AdamW, and one micro-batch's activations with checkpointing off and on."""
    b = dtype_bytes(arch.dtype if arch.dtype != "auto" else "bfloat16")
    rank, roll = int(data.get("lora", {}).get("rank", 16)), data.get("rollout", {})
    p = arch.lora_params(rank)
    completion = max(int(roll.get("propose_max_tokens", 512)), int(roll.get("solve_max_tokens", 512)))
    max_len = engine.get("max_model_len")
    prompt = roll.get("max_prompt_tokens") or (max_len - completion if max_len else DEFAULT_PROMPT_TOKENS)
    seq = min(completion + max(1, int(prompt)), max_len or arch.max_positions or 1 << 40)
    budget = int(trainer.get("micro_batch_tokens") or 0)
    if budget:  # the worst packing: the budget filled; the largest padding mask is two rows of half of it
        rows, tokens = max(1, budget // seq), max(budget, seq)
        mask = budget * min(seq, budget // 2) if budget >= 2 else 0
        comp_tokens = min(tokens, max(1, budget // (completion + 1)) * completion)
    else:
        rows = max(1, int(trainer.get("micro_batch_size", 8)))
        tokens, comp_tokens, mask = rows * seq, rows * completion, rows * seq * seq if rows > 1 else 0
    chunk = int(trainer.get("logprob_chunk_tokens") or 0)
    chunked = 0 < chunk < comp_tokens
    cast = 4 if b != 4 else 0  # the fp32 copy of bf16 logits
    if chunked:  # decoder's last hidden states, then one recomputed chunk at a time
        logits = chunk * arch.vocab * (b + CHUNKED_LOGIT_BYTES) + (tokens + comp_tokens) * arch.hidden * b
    else:
        logits = comp_tokens * arch.vocab * (b + cast + LOGIT_BYTES)
    # padded rows: transformers passes a boolean (rows, 1, L, L) mask, and SDPA saves a float copy of it per layer
    layer = tokens * layer_bytes_per_token(arch, b, rank, masked=mask > 0)
    off = arch.layers * (layer + mask * b) + mask + max(logits, int(layer * (BACKWARD_FACTOR - 1)))
    on = arch.layers * tokens * arch.hidden * b + mask * (1 + b) + max(logits, int(layer * BACKWARD_FACTOR))
    return dict(
        lora_params=p, adapter=4 * p, moments=8 * p, update=12 * p, keep=8 * p, off=off, on=on, logits=logits,
        rows=rows, seq=seq, tokens=tokens, budget=budget, chunk=chunk if chunked else comp_tokens, dtype_bytes=b,
    )  # fmt: skip


def plan_recipe(
    data: dict[str, Any], arch: Arch, *, gpu_bytes: int, gpus: int = 1, registry: Any = None, suggest: bool = True
) -> dict[str, Any]:
    """The plan of a resolved recipe dict: rows per GPU, both phases' peaks, disk, verdict and suggestions."""
    from .recipe_yaml import apply_overrides

    engine, _ = component_params(registry, "engine", data.get("engine") or {"name": "hf"})
    trainer, declared = component_params(registry, "trainer", data.get("trainer") or {"name": "trr++"})
    name = (data.get("trainer") or {}).get("name")
    notes = [f"trainer {name!r} has no {k}: planned as {v!r}" for k, v in ABSENT.items() if k not in declared]
    trainer = {**ABSENT, **{k: v for k, v in trainer.items() if k in declared or k not in ABSENT}}
    pop, rank = data.get("population", {}), int(data.get("lora", {}).get("rank", 16))
    members = int(pop.get("teachers", 4)) + (0 if pop.get("mode") == "single_agent" else int(pop.get("students", 4)))
    per_gpu = math.ceil(members / gpus)
    t = trainer_terms(arch, data, trainer, engine)
    base = arch.params * t["dtype_bytes"]
    rows: list[tuple[str, float, str]] = [
        ("trainer base", base, f"{params_text(arch.params)} params x {t['dtype_bytes']} bytes"),
        ("trainer AdamW moments", per_gpu * t["moments"], f"{per_gpu} members x 2 x fp32 adapter"),
        ("trainer scratch adapter", t["adapter"], f"fp32, rank {rank} on {', '.join(arch.targets)}"),
        ("trainer CUDA context", CUDA_CONTEXT, "outside torch's allocator"),
    ]
    context = PlanContext(arch, data, gpu_bytes, gpus, members, rank, t["seq"], t["adapter"], t["dtype_bytes"])
    own, why = engine_memory(registry, (data.get("engine") or {}).get("name", "hf"), engine, context)
    notes += why + own.notes
    rows += own.rows
    resident = base + CUDA_CONTEXT + per_gpu * t["moments"] + t["adapter"] + own.resident
    generation = resident + own.generating
    mode = {True: "on", False: "off"}.get(trainer["gradient_checkpointing"], str(trainer["gradient_checkpointing"]))
    on = mode == "on" or (mode == "auto" and trainer.get("device", "auto") != "cpu")  # auto: on with CUDA
    act = t["on"] if on else t["off"]
    shape = f"{t['tokens']} tokens, any rows" if t["budget"] else f"{t['rows']} x {t['seq']} tokens"
    training = resident + t["update"] + own.training + max(act, t["keep"])
    rows += [
        ("update: live AdamW + grads", t["update"], "of the member being trained"),
        ("update: activations", act, f"gradient_checkpointing {mode}: {'on' if on else 'off'}"),
        ("  checkpointing off", t["off"], f"micro-batch: {shape}"),
        ("  checkpointing on", t["on"], "layer inputs + one layer recomputed"),
        ("  log-prob peak in both", t["logits"], f"{t['chunk']} tokens x vocab {arch.vocab} at a time"),
    ]
    rows += own.training_rows
    phases = {"generation": generation, "training": training}
    over = [
        f"{k} phase ({v / GIB:.1f} GiB) exceeds {gpu_bytes / GIB:.1f} GiB by {(v - gpu_bytes) / GIB:.1f} GiB"
        for k, v in phases.items()
        if v > gpu_bytes
    ] + ([own.kv_short] if own.kv_short else [])
    peak = max(phases.values())
    result: dict[str, Any] = {
        "recipe": data.get("name"),
        "model": arch.source,
        "gpus": gpus,
        "gpu_gib": round(gpu_bytes / GIB, 2),
        "members": members,
        "members_per_gpu": per_gpu,
        "base_params": arch.params,
        "lora_params": t["lora_params"],
        "rows": [{"what": w, "gib": round(v / GIB, 2), "detail": d} for w, v, d in rows],
        "generation_gib": round(generation / GIB, 2),
        "training_gib": round(training / GIB, 2),
        "peak_gib": round(peak / GIB, 2),
        "trainer_side_bytes": int(per_gpu * t["moments"] + t["adapter"] + t["update"] + max(act, t["keep"])),
        "gradient_checkpointing": "on" if on else "off",
        "disk": _disk(data, members, t),
        "notes": notes,
        "fits": not over,
        "suggestions": [],
        "verdict": f"fits: peak {peak / GIB:.1f} GiB of {gpu_bytes / GIB:.1f} GiB per GPU",
    }
    if suggest and not over:  # room the engine could use that still fits (vLLM asleep: more KV cache)
        for change in own.roomier:
            trial = apply_overrides(data, [change])
            if plan_recipe(trial, arch, gpu_bytes=gpu_bytes, gpus=gpus, registry=registry, suggest=False)["fits"]:
                notes.append(f"{change.replace('=', ' up to ', 1)} also fits (more room for the engine)")
                break
    if over:
        if suggest:
            result["suggestions"] = _suggestions(
                data, arch, gpu_bytes, gpus, registry, dict(t, ckpt=on, per_gpu=per_gpu), own.candidates
            )
        tries = f"; try: {', '.join(result['suggestions'])}" if result["suggestions"] else ""
        result["verdict"] = f"does not fit: {'; '.join(over)}{tries}"
    return result


def _suggestions(
    data: dict[str, Any], arch: Arch, gpu_bytes: int, gpus: int, registry: Any, t: dict[str, Any], engine: list[str]
) -> list[str]:
    """Single changes that make the recipe fit (``key=value`` overrides or ``--gpus``), else one combination. The
    trainer's candidates come first, then the engine's (``engine``, nearest first); of a key the engine offers
    several values for, only the first that fits is suggested."""
    from .recipe_yaml import apply_overrides

    candidates = [] if t["ckpt"] else ['trainer.params.gradient_checkpointing="on"']  # quoted: YAML reads on as true
    if t["rows"] > 1:
        candidates.append(f"trainer.params.micro_batch_tokens={t['seq']}")
    if t["chunk"] > 2048:
        candidates.append("trainer.params.logprob_chunk_tokens=2048")
    candidates += engine
    values = Counter(c.split("=", 1)[0] for c in candidates)

    def several(change: str) -> bool:
        return values[change.split("=", 1)[0]] > 1

    def fits(changes: list[str], n: int = gpus) -> bool:
        trial = apply_overrides(data, changes)
        return bool(plan_recipe(trial, arch, gpu_bytes=gpu_bytes, gpus=n, registry=registry, suggest=False)["fits"])

    found: list[str] = []
    for change in candidates:
        key = change.split("=", 1)[0]
        if not any(f.split("=", 1)[0] == key for f in found) and fits([change]):
            found.append(change)
    if t["per_gpu"] > 1 and fits([], 2 * gpus):  # members split over more GPUs
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


def engine_memory(
    registry: Any, name: str, params: dict[str, Any], context: PlanContext
) -> tuple[EngineMemory, list[str]]:
    """The engine's own terms (its registered ``memory=`` function) and a note when it reports none."""
    try:
        report = registry.get("engine", name).meta.get("memory") if registry is not None else None
    except UserError:
        report = None
    if report is None:
        return EngineMemory(), [f"engine {name!r} reports no memory terms (register(..., memory=)): none planned"]
    return report(params, context), []


def _disk(data: dict[str, Any], members: int, t: dict[str, Any]) -> dict[str, Any]:
    """Each trained member writes one fp32 adapter version per step; ``adapters.keep`` decides what stays."""
    steps, ck = int(data.get("steps", 1)), data.get("checkpoint", {})
    policy = data.get("adapters") or {}
    keep = policy.get("keep", "all")
    if keep == "all":
        versions = members * (steps + 1)
    else:  # living members' current and first versions, every kept checkpoint's, those since the last prune
        versions = members * (2 + int(ck.get("keep", 2)) + int(ck.get("every", 10)))
        versions += members * (int(policy.get("last", 2)) - 1) if keep == "last" else 0
    return {
        "adapter_mb": round(t["adapter"] / 1e6, 1),
        "per_step_gb": round(members * t["adapter"] / 1e9, 3),
        "adapters_kept": keep if "keep" in policy else "all (the recipe has no adapters.keep)",
        "run_gb": round(versions * t["adapter"] / 1e9, 1),  # children of evolution add a version each
        "checkpoints_gb": round((int(ck.get("keep", 2)) + 1) * members * t["moments"] / 1e9, 1),
    }


def plan_file(
    recipe: str,
    overrides: Any,
    manager: Any,
    *,
    gpus: int = 1,
    gpu_memory: str | None = None,
    config: str | None = None,
) -> dict[str, Any]:
    """``populora plan``: check the flags, load and validate the recipe, find its model config, plan it."""
    from .recipe import load_recipe

    if gpus < 1:
        raise UserError(f"--gpus: {gpus} is not a GPU count (1 or more)")
    gpu_bytes, gpu_from = gpu_budget(gpu_memory)
    if config is not None and not Path(config).is_file():
        raise UserError(f"--config: {config} is not a file")
    model, data = load_recipe(recipe, list(overrides), manager.registry)
    return plan_loaded(model, data, manager.registry, recipe, gpu_bytes, gpu_from, gpus=gpus, config=config)


def gpu_budget(gpu_memory: str | None) -> tuple[int, str]:
    """(bytes per GPU, where that figure came from): ``--gpu-memory``, else the visible GPU, else the assumed one."""
    if gpu_memory is not None:
        return parse_memory(gpu_memory), "--gpu-memory"
    visible = _visible_gpu()
    return (visible, "this GPU") if visible else (ASSUMED_GPU_BYTES, "assumed")


def plan_loaded(
    model: Any,
    data: dict[str, Any],
    registry: Any,
    recipe: str | None,
    gpu_bytes: int,
    gpu_from: str,
    *,
    gpus: int = 1,
    config: str | None = None,
) -> dict[str, Any]:
    """The plan of an already loaded recipe (``populora plan``, ``populora run --dry-run``)."""
    result = plan_model(model, data, registry, recipe, gpu_bytes, gpus, config)
    result["gpu_memory_from"] = gpu_from
    return result


def plan_model(
    model: Any,
    data: dict[str, Any],
    registry: Any,
    recipe: str | None,
    gpu_bytes: int,
    gpus: int = 1,
    config: Any = None,
) -> dict[str, Any]:
    ref = model.base_model
    source = Path(config) if config else config_source(ref.name, registry, recipe, ref.params)
    registered = ref.name in registry.names("base_model")
    dtype = registry.base_model(ref.name, ref.params).dtype if registered else "auto"
    arch = load_arch(source, list(model.lora.target_modules), dtype)
    return plan_recipe(data, arch, gpu_bytes=gpu_bytes, gpus=gpus, registry=registry)


def _visible_gpu() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else 0


#: the GPU a plan is made for when none is visible and --gpu-memory is not given (an A100/H100 80 GB)
ASSUMED_GPU_BYTES = 80 * GIB


def params_text(n: float) -> str:
    """A parameter count as people write it: 7.62 B, 27.9 M, 0.1 M."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def does_not_fit(plan: dict[str, Any]) -> bool:
    return str(plan["verdict"]).startswith("does not fit")


def format_plan(plan: dict[str, Any]) -> str:
    """The table ``populora plan`` prints; the last line is the verdict."""
    d = plan["disk"]
    members = f"{plan['members']} member{'s' if plan['members'] != 1 else ''}"
    assumed = (
        " (assumed: no GPU is visible here; --gpu-memory sets it)" if plan.get("gpu_memory_from") == "assumed" else ""
    )
    lines = [
        f"{plan['recipe']}: {members} on {plan['gpus']} x {plan['gpu_gib']:.1f} GiB{assumed} "
        f"({plan['members_per_gpu']} per GPU); model config {plan['model']}",
        f"base {params_text(plan['base_params'])} params; one LoRA adapter {params_text(plan['lora_params'])} params",
        "",
        f"{'per GPU':<30}{'GiB':>8}  detail",
        *(f"{r['what']:<30}{r['gib']:>8.2f}  {r['detail']}" for r in plan["rows"]),
        f"{'peak while generating':<30}{plan['generation_gib']:>8.2f}",
        f"{'peak while training':<30}{plan['training_gib']:>8.2f}",
        "",
        f"disk: {d['adapter_mb']:.0f} MB per adapter version, {d['per_step_gb']:.2f} GB per step; kept: "
        f"{d['adapters_kept']} -> {d['run_gb']:.1f} GB per run; trainer checkpoints {d['checkpoints_gb']:.1f} GB",
        *(f"note: {n}" for n in plan["notes"]),
        plan["verdict"],
    ]
    return "\n".join(lines)


def warn_if_not_fits(model: Any, data: dict[str, Any], registry: Any, recipe: str | None = None) -> None:
    """``populora run``: one warning when the plan says the recipe will not fit on the visible GPU (CUDA only)."""
    import warnings

    try:
        gpu_bytes = _visible_gpu()
        result = plan_model(model, data, registry, recipe, gpu_bytes) if gpu_bytes else None
    except Exception:  # planning must never stop a run
        return
    if result is not None and not result["fits"]:
        warnings.warn(f"populora plan: {result['verdict']}", stacklevel=2)
