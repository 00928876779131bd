"""What engines and trainers tell ``populora plan`` about their GPU memory: the contract of
``register(..., memory=fn)`` for both kinds.

The plan owns the composition and the verdict; each engine and trainer plugin owns its own terms (an engine's
weights copy, LoRA slots, caches, what it keeps while the trainer updates; a trainer's base, optimizer state and
an update's activations), so the core holds no copy of their internals. A function is pure arithmetic on the
model's shape (:class:`Arch`, read from its config by :mod:`populora_core.services.architecture`) and the
component's params (defaults filled in): no torch, no GPU (the GPU itself, and the units the terms are written in
(``GIB``, ``dtype_bytes``, ``CUDA_CONTEXT``), are :mod:`populora_core.services.gpu`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: one plan table row: (what, bytes, detail)
Row = tuple[str, float, str]

#: share of the GPU an ``auto`` choice leaves free: torch's caching allocator reserves more than the plan's
#: allocated figures (fragmentation, blocks rounded up), and vLLM refuses to start without the memory it was given
AUTO_MARGIN = 0.05


@dataclass(frozen=True)
class Arch:
    """What the plan needs of a decoder: sizes, base parameters, and the LoRA-targeted linears."""

    source: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    params: int
    targets: dict[str, tuple[int, int, int]]  # module kind -> (count, d_in, d_out)
    dtype: str = "auto"  # the base's dtype on the GPU; auto = bfloat16

    def lora_params(self, rank: int) -> int:
        return rank * sum(n * (d_in + d_out) for n, d_in, d_out in self.targets.values())


@dataclass(frozen=True)
class PlanContext:
    """What the plan knows when it asks an engine: the model's shape, the resolved recipe, the GPU, and the
    trainer's side it plans beside the engine."""

    arch: Arch
    recipe: Any  # the typed recipe (populora_core.api.schema.Recipe): every section's defaults filled in
    gpu_bytes: int  # memory of one GPU
    gpus: int
    members: int  # adapters the run trains
    members_per_gpu: int  # of them, on one GPU (a trainer keeps their optimizer state)
    rank: int  # the recipe's LoRA rank
    seq: int  # the longest row: prompt (rollout.max_prompt_tokens, else what the engine's max_len leaves) + completion
    adapter_bytes: int  # one fp32 adapter (what a trainer writes per version)
    dtype_bytes: int  # bytes per base parameter of the trainer's (and a shared) base


@dataclass
class EngineMemory:
    """An engine's terms, per GPU. ``resident``: bytes held in both phases on top of the trainer's (an engine
    sharing the trainer's base: its served versions); ``generating``: bytes added while generating; ``training``:
    bytes kept while the trainer updates (an engine that sleeps keeps its fixed pools only). ``rows`` are shown
    before the trainer's update rows, ``training_rows`` after them. ``kv_short``: a reason the recipe cannot run
    whatever the totals (a KV cache under one sequence). ``candidates``: ``key=value`` overrides of the engine's
    params the plan may try when the recipe does not fit, nearest first; ``roomier``: overrides that give the engine
    more room, most first, of which the plan notes the first that still fits. ``auto``: for each of the engine's
    params the recipe leaves ``auto``, the values to try, preferred first; the plan runs (and ``populora run`` on a
    GPU builds the engine with) the first combination that fits with a margin (:data:`AUTO_MARGIN`), the first
    key's values tried slowest."""

    rows: list[Row] = field(default_factory=list)
    training_rows: list[Row] = field(default_factory=list)
    max_len: int | None = None  # the longest sequence the engine serves (bounds the prompt the plan assumes)
    resident: float = 0.0
    generating: float = 0.0
    training: float = 0.0
    kv_short: str | None = None
    notes: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    roomier: list[str] = field(default_factory=list)
    auto: dict[str, list[Any]] = field(default_factory=dict)
    host_rows: list[Row] = field(default_factory=list)  # host RAM per process (its peak is their sum)


@dataclass
class TrainerMemory:
    """A trainer's terms, per GPU. ``resident``: bytes held in both phases (its base, every member's optimizer
    state, its scratch adapter, the process's CUDA context); ``update``: bytes added while one member updates
    (live optimizer and gradients, the larger of activations and what is kept meanwhile). ``rows`` are shown first,
    ``update_rows`` after the engine's rows. ``member_state_bytes``: one member's optimizer state (checkpoints);
    ``side_bytes``: what the trainer adds beside a shared base (a measured peak is compared with it);
    ``served_copy_bytes``: the copy of each version it writes beside the fp32 one for the engine (disk);
    ``gradient_checkpointing``: "on" or "off" as planned. ``candidates``: overrides of the trainer's params the plan
    may try when the recipe does not fit."""

    rows: list[Row] = field(default_factory=list)
    update_rows: list[Row] = field(default_factory=list)
    resident: float = 0.0
    update: float = 0.0
    member_state_bytes: int = 0
    side_bytes: int = 0
    served_copy_bytes: int = 0
    gradient_checkpointing: str = "off"
    notes: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    host_rows: list[Row] = field(default_factory=list)  # host RAM per process, beyond Python and the libraries
    host: float = 0.0  # their peak (they need not coincide)
