"""Where and in what dtype a base model loads: the device ``auto`` means, the dtype ``auto`` means on it, and the
``from_pretrained`` arguments that put the weights there. torch is imported inside functions only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..api.errors import UserError

if TYPE_CHECKING:
    import torch


def resolve_device(device: str = "auto") -> str:
    """``auto``: the first CUDA device when there is one, else the CPU."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``auto`` is float32 on CPU (bf16 kernels are slow there and change greedy tokens), bf16 on GPU."""
    import torch

    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype not in table:
        raise UserError(f"base_model.dtype: unknown dtype {dtype!r} (known: auto, {', '.join(table)})")
    return table[dtype]


def load_kwargs(device: str, dtype: Any) -> dict[str, Any]:
    """``from_pretrained`` arguments: on an accelerator the weights go straight to it (``device_map``), so a node
    of 8 workers does not first hold 8 host copies of a 7B base (~120 GB); on the CPU the plain load. A bare
    ``cuda`` is the current CUDA device, where the rest of the host's tensors go: transformers reads it as
    ``cuda:$LOCAL_RANK``, another GPU under launchers that set LOCAL_RANK without narrowing the visible ones."""
    if device == "cpu":
        return {"dtype": dtype}
    if device == "cuda":
        import torch

        device = f"cuda:{torch.cuda.current_device()}"
    return {"dtype": dtype, "device_map": device}
