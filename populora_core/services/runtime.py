"""Process settings a recipe asks for that must be in place before torch loads (the ``runtime`` section), and the
one owner of torch's thread count: no component calls ``torch.set_num_threads`` (a test scans for it).

``threads`` is set once, by ``start_run``/``resume_run`` (:func:`apply_threads`), whoever starts the run (the
``populora`` command, a benchmark, a notebook): as ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (read when torch loads;
children inherit them) and in torch itself where it is already imported. :func:`set_torch_threads` is for a
process the core does not start (a Ray worker); :func:`torch_threads` scopes a section that must run torch on
fewer threads (an operator's per-module threads).

``cpu_isa: avx2`` makes a seed's run reproduce across x86 CPUs: torch's vectorized kernels, MKL's GEMMs and
oneDNN take their AVX2 code paths even where the CPU has AVX-512, so an AVX-512 box computes what an AVX2 box
computes (MKL's conditional numerical reproducibility, ``MKL_CBWR``, is documented for exactly this). The
variables are read once, when the libraries first dispatch, so the ``populora`` command sets them
(:func:`apply_cpu_isa`) before it imports anything that imports torch; Ray workers and other child processes
inherit them. A Python caller that imported torch first cannot have them (set them before importing torch).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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


#: The trainer's CUDA caching allocator: rows of every length leave fixed-size segments fragmented (memory reserved
#: beyond what the plan counts as allocated); expandable segments grow one mapping instead. vLLM 0.32-0.34's sleep
#: pools (``CuMemAllocator.use_memory_pool``, vllm/device_allocator/cumem.py) turn it off around their own
#: allocations and back on after, so it is safe beside sleep mode there (older vLLMs asserted on it instead).
ALLOCATOR_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
#: any of these in the environment is the user's allocator setting, kept as it is (torch reads the first it finds)
ALLOCATOR_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def default_allocator() -> dict[str, str]:
    """:data:`ALLOCATOR_ENV` into ``os.environ`` where torch is a CUDA build, unless the user set an allocator
    configuration or CUDA is already initialised here (torch reads it then); returns what it set. Processes the run
    starts inherit it."""
    from .installed import torch_cuda_version

    cuda = torch_cuda_version()  # from torch/version.py as text: torch itself is not imported yet
    if cuda is None or cuda.startswith("ROCm") or any(os.environ.get(var) for var in ALLOCATOR_VARS):
        return {}
    torch = sys.modules.get("torch")
    if torch is not None and getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)():
        return {}
    os.environ.update(ALLOCATOR_ENV)
    return dict(ALLOCATOR_ENV)


def threads_env(section: Any) -> dict[str, str]:
    """The thread variables of a ``runtime`` section (none where ``threads`` is None: the environment decides)."""
    if section.threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(section.threads), "MKL_NUM_THREADS": str(section.threads)}


def set_torch_threads(threads: int) -> None:
    """torch's intra-op threads for the rest of this process (a worker process the recipe's start did not set)."""
    import torch

    torch.set_num_threads(int(threads))


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch on ``threads`` threads inside, the process's count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def apply_cpu_isa(section: Any, *, stacklevel: int = 3) -> dict[str, str]:
    """Set the section's ``cpu_isa`` variables in ``os.environ`` (children inherit them); returns what it set.

    Where torch is already imported in this process its kernels may have dispatched already, so ``cpu_isa`` is not
    set (a warning says so): this process and the workers it starts keep the same code paths. A variable that
    already held another value is replaced (the recipe wins), with a warning naming the setting.
    """
    env = dict(CPU_ISA_ENV[section.cpu_isa])
    if env and "torch" in sys.modules:
        warnings.warn(
            f"runtime.cpu_isa={section.cpu_isa} cannot apply: torch is already imported in this process "
            "(set it before torch loads); the CPU's native code paths are used",
            stacklevel=stacklevel,
        )
        return {}
    _set_env(section, "cpu_isa", env, stacklevel + 1)
    return env


def apply_threads(section: Any, *, stacklevel: int = 3) -> dict[str, str]:
    """The section's ``threads``: ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in ``os.environ`` (read when torch loads;
    the processes the run starts inherit them), and torch's own count where torch is already imported; returns
    the variables it set (none where ``threads`` is None). ``start_run`` and ``resume_run`` call it first, so a
    run uses the recipe's thread count whoever starts it. A variable that held another value is replaced (the
    recipe wins), with a warning naming the setting."""
    env = threads_env(section)
    if env and "torch" in sys.modules:
        set_torch_threads(section.threads)
    _set_env(section, "threads", env, stacklevel + 1)
    return env


def _set_env(section: Any, setting: str, env: dict[str, str], stacklevel: int) -> None:
    olds = [f"{key}={os.environ[key]}" for key, value in env.items() if os.environ.get(key, value) != value]
    os.environ.update(env)
    if olds:
        value = getattr(section, setting)
        warnings.warn(
            f"runtime.{setting}={value}: {', '.join(olds)} in the environment replaced (the recipe wins)",
            stacklevel=stacklevel,
        )
