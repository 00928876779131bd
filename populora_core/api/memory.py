"""What engines and trainers tell ``populora plan`` about their GPU memory: the contract of
``register(..., memory=fn)`` for both kinds.

The plan owns the composition and the verdict; each engine and trainer plugin owns its own terms (an engine's
weights copy, LoRA slots, caches, what it keeps while the trainer updates; a trainer's base, optimizer state and
an update's activations), so the core holds no copy of their internals. A function is pure arithmetic on the
model's shape (:class:`~populora_core.api.architecture.Arch`) and the component's params (defaults filled in): no
torch, no GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .architecture import GIB, Arch
from .errors import UserError

#: one plan table row: (what, bytes, detail)
Row = tuple[str, float, str]

#: per process, outside torch's allocator (CUDA context, cuBLAS workspaces)
CUDA_CONTEXT = 2**29

#: share of the GPU an ``auto`` choice leaves free: torch's caching allocator reserves more than the plan's
#: allocated figures (fragmentation, blocks rounded up), and vLLM refuses to start without the memory it was given
AUTO_MARGIN = 0.05


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


def visible_gpu_bytes() -> int:
    """Total memory of this process's first GPU as torch sees it (0 without CUDA): what a plan is made for."""
    import torch

    if not torch.cuda.is_available():
        check_visible_devices()
        return 0
    return int(torch.cuda.get_device_properties(0).total_memory)


def visible_gpu_memory() -> tuple[int, int]:
    """(free, total) bytes of this process's first GPU now ((0, 0) without CUDA). Reading free memory creates this
    process's CUDA context, so it is for a process about to use the GPU anyway."""
    import torch

    if not visible_gpu_bytes():
        return 0, 0
    free, total = torch.cuda.mem_get_info(0)
    return int(free), int(total)


def gpu_held_by_others(free: int, total: int, own: int) -> int:
    """Bytes of the GPU that neither are free nor are this process's ``own`` (its CUDA context, which its plan
    counts): another process's, which a plan on the total would promise to ours. 0 when none."""
    return max(0, total - free - own)


def gpu_memory_line(free: int, total: int, held: int) -> str:
    """The run.log line saying which figure a plan was made on."""
    figures = f"GPU memory at start: {total / GIB:.1f} GiB total, {free / GIB:.1f} GiB free"
    if held:
        return f"{figures}; {held / GIB:.1f} GiB held by other processes: planned on free memory (a row for them)"
    return f"{figures}; nothing held by other processes: planned on total memory"


def check_visible_devices() -> None:
    """CUDA_VISIBLE_DEVICES that names no GPU leaves a CUDA torch without one: a GPU recipe would run on the CPU
    (days for a 7B) without a word, so it is an error naming the variable. Empty or -1: the CPU on purpose."""
    import torch

    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or value.strip() in ("", "-1") or torch.version.cuda is None or torch.cuda.is_available():
        return
    raise UserError(
        f"CUDA_VISIBLE_DEVICES={value} names no GPU this process can use (torch {torch.__version__}, a CUDA build, "
        "sees none): name GPUs `nvidia-smi -L` lists by index or UUID, or set CUDA_VISIBLE_DEVICES= (empty) to run "
        "on the CPU on purpose"
    )
