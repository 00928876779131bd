"""The trainers' GPU memory terms for ``populora plan`` (registered with ``memory=``): the base, every member's AdamW
moments, the scratch adapter, and one update's activations with gradient checkpointing off and on, from the
model's shape alone. tests/core/test_plan.py checks them against peaks measured on CPU."""

from __future__ import annotations

import dataclasses
from typing import Any

from populora_core.api.memory import Arch, PlanContext, TrainerMemory
from populora_core.services.gpu import CUDA_CONTEXT, params_text

from .forward import long_row_threshold, use_checkpointing

BACKWARD_FACTOR = 1.5  # one layer's saved tensors plus the gradients alive while autograd walks through it
# bytes per vocab logit besides the logits: in one piece autograd keeps the fp32 log-softmax and probs (entropy)
# and makes two gradients; the recomputed chunks (logprob_chunk_tokens) hold the log-softmax, probs and one gradient
LOGIT_BYTES, CHUNKED_LOGIT_BYTES = 16, 12
_SHARED_INPUT = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"})  # modules that read one tensor
#: params the plan reads, and what it assumes where a trainer has no such param (grpo: no token budget)
ABSENT: dict[str, Any] = {"micro_batch_tokens": None, "gradient_checkpointing": "off", "logprob_chunk_tokens": None}


def layer_bytes_per_token(arch: Arch, b: int, rank: int, masked: bool) -> int:
    """Bytes autograd keeps per token and decoder layer when LoRA (fp32) trains on a base of ``b`` bytes."""
    h, i, f = arch.hidden, arch.intermediate, 4
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    inputs = {k: d_in for k, (_, d_in, _) in arch.targets.items()}
    for group in _SHARED_INPUT:  # modules that read one tensor share it, and on a 16-bit base its one fp32 cast
        for k in sorted(group & set(inputs))[1:]:
            inputs.pop(k)
    lora = (sum(inputs.values()) + len(arch.targets) * rank) * f  # LoRA inputs and A outputs, fp32
    attention = (2 * q + 2 * (q if masked else kv)) * b  # q, k, v (repeated for GQA under a mask), output
    return lora + 2 * h * 4 + attention + 3 * i * b  # + RMSNorms' fp32 inputs + gate, silu(gate), up


def activation_terms(arch: Arch, params: dict[str, Any], ctx: PlanContext) -> dict[str, Any]:
    """One micro-batch's activations with checkpointing off and on, and the log-prob peak in both."""
    b, rank, seq, roll = ctx.dtype_bytes, ctx.rank, ctx.seq, ctx.recipe.rollout
    completion = min(seq, max(roll.propose_max_tokens, roll.solve_max_tokens))
    budget = int(params["micro_batch_tokens"] or 0)
    if budget:  # the worst packing: the budget filled; the largest padding mask is two rows of half of it
        rows, tokens = max(1, budget // seq), max(budget, seq)
        mask = budget * min(seq, budget // 2) if budget >= 2 else 0
        comp_tokens = min(tokens, max(1, budget // (completion + 1)) * completion)
    else:
        rows = max(1, int(params["micro_batch_size"]))
        tokens, comp_tokens, mask = rows * seq, rows * completion, rows * seq * seq if rows > 1 else 0
    chunk = int(params["logprob_chunk_tokens"] or 0)
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
    shown = chunk if chunked else comp_tokens
    return dict(off=off, on=on, logits=logits, rows=rows, tokens=tokens, budget=budget, chunk=shown)


def _micro_batch_terms(arch: Arch, params: dict[str, Any], ctx: PlanContext, device: str) -> tuple[dict[str, Any], str]:
    """The largest micro-batch's terms and its shape. With ``long_row_tokens`` (auto: on the GPU the plan is for)
    the longest rows train alone and unmasked, so the worst is the larger of one longest row and a full
    micro-batch of rows just under the threshold."""
    threshold = long_row_threshold(params["long_row_tokens"], device)
    if threshold is None or ctx.seq < threshold:
        t = activation_terms(arch, params, ctx)
        return t, (f"{t['tokens']} tokens, any rows" if t["budget"] else f"{t['rows']} x {ctx.seq} tokens")
    alone = activation_terms(arch, {**params, "micro_batch_size": 1, "micro_batch_tokens": None}, ctx)
    below = activation_terms(arch, params, dataclasses.replace(ctx, seq=threshold - 1))
    t = {**below, **{k: max(alone[k], below[k]) for k in ("off", "on", "logits")}}
    rows = f"{below['tokens']}" if below["budget"] else f"{below['rows']} x {threshold - 1}"
    return t, f"1 x {ctx.seq} tokens alone (long_row_tokens {threshold}), or {rows} tokens padded"


def trainer_memory(parsed: Any, ctx: PlanContext, *, name: str) -> TrainerMemory:
    """``trr++``'s and ``grpo``'s terms (``name``: which, for the notes on params it does not have); registered as
    ``partial(trainer_memory, name=...)``. ``parsed``: the trainer's params model; the terms read its values, every
    default filled, and :data:`ABSENT` where the trainer has no such param."""
    arch, b, per_gpu = ctx.arch, ctx.dtype_bytes, ctx.members_per_gpu
    has = set(type(parsed).model_fields)
    notes = [f"trainer {name!r} has no {k}: planned as {v!r}" for k, v in ABSENT.items() if k not in has]
    params = {**ABSENT, **parsed.model_dump()}
    p = arch.lora_params(ctx.rank)
    moments, live, keep = 8 * p, 12 * p, 8 * p
    device = "cpu" if params["device"] == "cpu" else "cuda"  # a plan is for a GPU unless told
    t, shape = _micro_batch_terms(arch, params, ctx, device)
    served = params["served_dtype"]  # auto: a copy when the base is 16-bit (state.served_dtype)
    copy = 0 if served == "none" or (served == "auto" and b == 4) else 2 * p
    setting = params["gradient_checkpointing"]
    mode = {True: "on", False: "off"}.get(setting, str(setting))
    on = use_checkpointing(mode, device)
    act = t["on"] if on else t["off"]
    base = arch.params * b
    candidates = [] if on else ['trainer.params.gradient_checkpointing="on"']  # quoted: YAML reads on as true
    if t["rows"] > 1 and "micro_batch_tokens" in has:
        candidates.append(f"trainer.params.micro_batch_tokens={ctx.seq}")
    if t["chunk"] > 2048 and "logprob_chunk_tokens" in has:
        candidates.append("trainer.params.logprob_chunk_tokens=2048")
    return TrainerMemory(
        rows=[
            ("trainer base", base, f"{params_text(arch.params)} params x {b} bytes"),
            ("trainer AdamW moments", per_gpu * moments, f"{per_gpu} members x 2 x fp32 adapter"),
            ("trainer scratch adapter", ctx.adapter_bytes, f"fp32, rank {ctx.rank} on {', '.join(arch.targets)}"),
            ("trainer CUDA context", CUDA_CONTEXT, "outside torch's allocator"),
        ],
        update_rows=[
            ("update: live AdamW + grads", live, "of the member being trained"),
            ("update: activations", act, f"gradient_checkpointing {mode}: {'on' if on else 'off'}"),
            ("  checkpointing off", t["off"], f"micro-batch: {shape}"),
            ("  checkpointing on", t["on"], "layer inputs + one layer recomputed"),
            ("  log-prob peak in both", t["logits"], f"{t['chunk']} tokens x vocab {arch.vocab} at a time"),
        ],
        resident=base + CUDA_CONTEXT + per_gpu * moments + ctx.adapter_bytes,
        update=live + max(act, keep),
        member_state_bytes=moments,
        side_bytes=int(per_gpu * moments + ctx.adapter_bytes + live + max(act, keep)),
        served_copy_bytes=copy,
        gradient_checkpointing="on" if on else "off",
        notes=notes,
        candidates=candidates,
        host_rows=[
            ("trainer: base load", 0, "none: device_map puts the weights straight on the GPU (safetensors mmap)"),
            ("trainer: resumed moments", per_gpu * moments, f"{per_gpu} members, on host until each one's update"),
            ("trainer: checkpoint copy", moments, "one member's moments at a time, while written"),
            (
                "trainer: version written",
                ctx.adapter_bytes + copy,
                "one fp32 adapter"
                + (f" and its {served if served != 'auto' else '16-bit'} copy" if copy else "")
                + ", while saved",
            ),
        ],
        host=max(per_gpu * moments, moments) + ctx.adapter_bytes + copy,
    )
