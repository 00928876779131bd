"""Process settings a recipe asks for that must be in place before torch loads (the ``runtime`` section).

``cpu_isa: avx2`` makes a seed's run reproduce across x86 CPUs: torch's vectorized kernels, MKL's GEMMs and
oneDNN take their AVX2 code paths even where the CPU has AVX-512, so an AVX-512 box computes what an AVX2 box
computes (MKL's conditional numerical reproducibility, ``MKL_CBWR``, is documented for exactly this). The
variables are read once, when the libraries first dispatch, so the ``populora`` command sets them before it
imports anything that imports torch; Ray workers and other child processes inherit them.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

#: cpu_isa -> the environment that pins it (native: nothing, each library picks the CPU's widest path)
CPU_ISA_ENV: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorized kernels (softmax, exp, reductions, ...)
        "MKL_CBWR": "AVX2",  # MKL's GEMMs (torch's fp32 matmuls on CPU): the AVX2 branch on any CPU that has it
        "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's primitives (no effect on the nano recipes' results today)
    },
}


def runtime_env(section: Any) -> dict[str, str]:
    """The environment variables a ``runtime`` section sets."""
    return dict(CPU_ISA_ENV[section.cpu_isa])


def apply_runtime(section: Any) -> dict[str, str]:
    """Set the section's variables in ``os.environ`` (children inherit them); returns what it set.

    Where torch is already imported in this process its kernels may have dispatched already, so nothing is set
    (a warning says so): this process and the workers it starts keep the same code paths. A variable that
    already held another value is replaced (the recipe wins), with a warning.
    """
    env = runtime_env(section)
    if not env:
        return env
    if "torch" in sys.modules:
        warnings.warn(
            f"runtime.cpu_isa={section.cpu_isa} cannot apply: torch is already imported in this process "
            "(set it before torch loads); the CPU's native code paths are used",
            stacklevel=3,
        )
        return {}
    for key, value in env.items():
        old = os.environ.get(key)
        if old is not None and old != value:
            warnings.warn(
                f"runtime.cpu_isa={section.cpu_isa}: {key}={old} in the environment replaced by {value}", stacklevel=3
            )
        os.environ[key] = value
    return env
