"""What an engine tells ``populora plan`` about its GPU memory: the contract of ``register(..., memory=fn)``.

The plan owns the trainer's terms and the verdict; each engine plugin owns its own terms (its weights copy, LoRA
slots, caches, what it keeps while the trainer updates), so the core holds no copy of an engine's internals. The
function is pure arithmetic on the model's shape (:class:`~populora_core.architecture.Arch`) and the engine's
params (defaults filled in): no torch, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .architecture import Arch

#: one plan table row: (what, bytes, detail)
Row = tuple[str, float, str]


@dataclass(frozen=True)
class PlanContext:
    """What the plan knows when it asks an engine: the model's shape, the resolved recipe, the GPU, and the
    trainer's side it plans beside the engine."""

    arch: Arch
    recipe: dict[str, Any]  # the resolved recipe (defaults of the core's sections may be absent)
    gpu_bytes: int  # memory of one GPU
    gpus: int
    members: int  # adapters the run trains
    rank: int  # the recipe's LoRA rank
    seq: int  # the trainer's longest row (prompt + completion tokens)
    adapter_bytes: int  # one fp32 adapter (what the trainer writes per version)
    dtype_bytes: int  # bytes per base parameter of the trainer's (and a shared) base


@dataclass
class EngineMemory:
    """An engine's terms, per GPU. ``resident``: bytes held in both phases on top of the trainer's (an engine
    sharing the trainer's base: its served versions); ``generating``: bytes added while generating; ``training``:
    bytes kept while the trainer updates (an engine that sleeps keeps its fixed pools only). ``rows`` are shown
    before the trainer's update rows, ``training_rows`` after them. ``kv_short``: a reason the recipe cannot run
    whatever the totals (a KV cache under one sequence). ``candidates``: ``key=value`` overrides of the engine's
    params the plan may try when the recipe does not fit, nearest first; ``roomier``: overrides that give the engine
    more room, most first, of which the plan notes the first that still fits."""

    rows: list[Row] = field(default_factory=list)
    training_rows: list[Row] = field(default_factory=list)
    resident: float = 0.0
    generating: float = 0.0
    training: float = 0.0
    kv_short: str | None = None
    notes: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    roomier: list[str] = field(default_factory=list)
