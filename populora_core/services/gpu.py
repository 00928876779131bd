"""The GPU this process sees: its memory as torch reports it (what a plan is made for), what other processes hold
of it, and a ``CUDA_VISIBLE_DEVICES`` that names none; the units memory terms are written in (``GIB``,
``dtype_bytes``, ``CUDA_CONTEXT``, ``params_text``). torch is imported inside functions only.
"""

from __future__ import annotations

import os
from typing import Any

from ..api.errors import UserError

#: bytes in a GiB
GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}

#: per process, outside torch's allocator (CUDA context, cuBLAS workspaces)
CUDA_CONTEXT = 2**29


def dtype_bytes(dtype: Any) -> int:
    return _DTYPE_BYTES.get(str(dtype), 2)


def params_text(n: float) -> str:
    """A parameter count as people write it: 7.62 B, 27.9 M, 0.1 M."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


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
