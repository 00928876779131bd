"""Each engine's GPU memory terms for ``populora plan`` (registered with ``memory=``): arithmetic on the model's
shape and the engine's params, no torch. The plan adds the trainer's side and decides whether the recipe fits."""

from __future__ import annotations

import math
from typing import Any

from populora_core.api.memory import EngineMemory, PlanContext, Row
from populora_core.services.gpu import GIB, dtype_bytes

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
#: gpu_memory_utilization values ``auto`` may choose, largest first
UTILIZATIONS = [pct / 100 for pct in range(95, 9, -1)]
VLLM_FIXED = 3 * GIB // 2  # vLLM's non-torch memory and CUDA-graph pools: what stays on the GPU while it sleeps
#: vLLM's engine-core process (multiprocessing, vLLM's default on a GPU) holds its own CUDA context, cuBLAS handles
#: and NCCL buffers, created before it measures the GPU, so outside gpu_memory_utilization (vllm/v1/worker/
#: gpu_worker.py init_device, 0.32-0.34). A CUDA context alone is 287 MB with lazy module loading, 667 MB without
#: (pytorch/pytorch#86509, measured on one op); vLLM loads attention, sampling and GEMM kernels on top: 1 GiB
VLLM_PROCESS_CONTEXT = GIB


def vllm_rank_slot(rank: int) -> int | None:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``; None when none does."""
    return next((r for r in VLLM_RANKS if r >= rank), None)


def hf_memory(params: Any, ctx: PlanContext) -> EngineMemory:
    """The hf engine shares the trainer's base; its served versions (fp32, LRU) stay while training, its
    generation KV cache (``token_budget`` tokens) exists while it generates. ``params``: its HFEngineParams."""
    arch = ctx.arch
    served = min(max(32, params.max_loaded_adapters), ctx.members * (ctx.recipe.steps + 1))
    budget = params.token_budget
    kv = budget * 2 * arch.layers * arch.kv_heads * arch.head_dim * ctx.dtype_bytes
    versions = served * ctx.adapter_bytes
    return EngineMemory(
        rows=[
            ("hf served versions", versions, f"{served} versions, fp32 (max_loaded_adapters)"),
            ("hf generation KV cache", kv, f"token_budget {budget}"),
        ],
        resident=versions,
        generating=kv,
    )


def vllm_memory(params: Any, ctx: PlanContext) -> EngineMemory:
    """vLLM's budget (gpu_memory_utilization x GPU) split into its own weights, LoRA slots, overhead and KV cache;
    asleep (``sleep: always``) it keeps its fixed pools only while the trainer updates. Its ``auto`` settings are
    offered to the plan as values to try, preferred first: awake over asleep (sleeping costs seconds a step), the
    largest share of the GPU over smaller ones (more KV cache). ``params``: its VLLMEngineParams."""
    arch = ctx.arch
    vb, tp = dtype_bytes(params.dtype or arch.dtype), params.tensor_parallel_size
    extra, big = params.extra, ctx.gpu_bytes >= 70 * GIB  # vLLM's offline defaults: H100/H200 or others
    seqs = int(extra.get("max_num_seqs") or (1024 if big else 256))
    batched = int(extra.get("max_num_batched_tokens") or (16384 if big else 8192))
    max_len = int(params.max_model_len or arch.max_positions or ctx.seq)
    max_rank = params.max_lora_rank or vllm_rank_slot(ctx.rank) or ctx.rank
    auto = {
        key: values
        for key, values in (("sleep", ["never", "always"]), ("gpu_memory_utilization", UTILIZATIONS))
        if getattr(params, key) == "auto"
    }
    util = float(UTILIZATIONS[0] if "gpu_memory_utilization" in auto else params.gpu_memory_utilization)
    budget = util * ctx.gpu_bytes
    weights, loras = arch.params * vb / tp, params.max_loras
    slots = loras * arch.lora_params(max_rank) * vb / tp
    overhead = VLLM_FIXED + batched * (3 * arch.intermediate + 6 * arch.hidden) * vb / tp + seqs * arch.vocab * 8
    kv = budget - weights - slots - overhead
    per_token = 2 * arch.layers * arch.kv_heads * arch.head_dim * vb / tp
    kv_tokens = max(0, int(kv // per_token))
    sleeps = params.sleep == "always"
    asleep = VLLM_FIXED if sleeps else budget
    own_process = params.multiprocessing is not False  # in-process it shares the trainer's context
    notes = []
    if kv_tokens >= max_len and max_len * seqs * per_token > kv:
        notes.append(
            f"vLLM: max_model_len x max_num_seqs ({max_len} x {seqs}) would need {max_len * seqs * per_token / GIB:.0f}"
            f" GiB of KV cache; it holds {kv_tokens // max_len} full-length sequences at once (shorter ones share)"
        )
    notes += _largest_call_note(ctx.recipe, kv_tokens, ctx.gpus, sleeps)
    percent = round(util * 100)
    candidates = [] if sleeps or "sleep" in auto else ["engine.params.sleep=always"]
    if "gpu_memory_utilization" not in auto:  # auto: the plan already chose the largest that fits
        nearest = sorted(set(range(10, 96, 5)) - {percent}, key=lambda x: (abs(x - percent), x))  # lower first
        candidates += [f"engine.params.gpu_memory_utilization={pct / 100:.2f}" for pct in nearest]
    candidates += [f"engine.params.max_loras={n}" for n in (4, 2) if n < loras]
    return EngineMemory(
        rows=[
            (
                "vLLM process CUDA context",
                VLLM_PROCESS_CONTEXT if own_process else 0.0,
                "its engine-core process's own, outside gpu_memory_utilization"
                if own_process
                else "none: multiprocessing false, it shares this process's",
            ),
            ("vLLM weights", weights, f"its own copy, {vb} bytes/param, tensor_parallel_size {tp}"),
            ("vLLM LoRA slots", slots, f"max_loras {loras} x rank {max_rank}, {vb} bytes"),
            ("vLLM activations, graphs", overhead, f"max_num_batched_tokens {batched}, max_num_seqs {seqs}"),
            ("vLLM KV cache", kv, f"{kv_tokens} tokens = {kv_tokens // max_len} x max_model_len {max_len}"),
        ],
        training_rows=[("vLLM while training", asleep, "asleep (sleep mode)" if asleep < budget else "awake")],
        resident=VLLM_PROCESS_CONTEXT if own_process else 0.0,
        generating=budget,
        training=asleep,
        kv_short=None
        if kv_tokens >= max_len
        else f"vLLM KV cache ({kv / GIB:.1f} GiB) is under one max_model_len {max_len} sequence "
        f"({max_len * per_token / GIB:.2f} GiB)",
        notes=notes,
        candidates=candidates,
        # asleep, more of the GPU may go to the KV cache while generating
        roomier=[f"engine.params.gpu_memory_utilization={pct / 100:.2f}" for pct in range(95, percent, -5)]
        if asleep < budget and not auto
        else [],
        auto=auto,
        host_rows=_vllm_host_rows(params, ctx, weights, vb, sleeps),
    )


def _largest_call_note(recipe: Any, kv_tokens: int, gpus: int, sleeps: bool) -> list[str]:
    """A step's largest generation call (the students' solve samples) against the KV cache, per GPU: one that does
    not fit at once is queued and preempted by vLLM (recomputed), so the step takes longer; say which settings."""
    rollout = recipe.rollout
    proposals = recipe.population.teachers * rollout.proposals_per_teacher * len(recipe.tasks)
    sequences = math.ceil(proposals * rollout.solver_samples / gpus)
    prompt = rollout.max_prompt_tokens or 0
    tokens = sequences * (prompt + rollout.solve_max_tokens)
    if not kv_tokens or tokens <= kv_tokens:
        return []
    share = kv_tokens / tokens
    return [
        f"vLLM KV cache ({kv_tokens} tokens) holds {share:.0%} of a step's largest generation call at its longest "
        f"({sequences} solver samples x {'max_prompt_tokens + ' if prompt else ''}solve_max_tokens = {tokens} tokens"
        f"{' per GPU' if gpus > 1 else ''}): vLLM queues and preempts the rest (slower steps); "
        f"raise engine.params.gpu_memory_utilization{'' if sleeps else ' (sleep: always leaves it more room)'}, "
        "or lower rollout.solver_samples, rollout.solve_max_tokens or rollout.proposals_per_teacher"
    ]


def _vllm_host_rows(params: Any, ctx: PlanContext, weights: float, vb: int, sleeps: bool) -> list[Row]:
    """vLLM's host RAM beyond its process: level-1 sleep backs its weights up in pinned host memory; its CPU LoRA
    cache holds ``max_cpu_loras`` adapters; the adapter copies it is handed sit in tmpfs (RAM too)."""
    level = params.sleep_level
    backup = weights if sleeps and level == 1 else 0
    cpu_loras = params.max_cpu_loras or 4 * params.max_loras
    shm = params.tmpfs_max_bytes
    shm_bytes = (2 * GIB if shm is None else shm) if params.use_tmpfs else 0
    return [
        ("vLLM: sleep backup", backup, f"its weights, pinned (sleep {'always' if sleeps else 'never'}, level {level})"),
        ("vLLM: CPU LoRA cache", cpu_loras * ctx.arch.lora_params(ctx.rank) * vb, f"max_cpu_loras {cpu_loras}"),
        ("vLLM: adapter copies", shm_bytes, "in tmpfs (RAM): at most tmpfs_max_bytes (default <= 2 GiB)"),
    ]
