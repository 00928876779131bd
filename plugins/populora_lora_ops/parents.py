"""What the operators share about their parents: B = 0 detection, refactoring a result to the parents' form, and
the seeded draws (one generator per module) every random operator makes. The parents' count (each operator's
registered ``min_parents``/``max_parents``) and compatibility are the core's to check, before an operator runs
(``populora_core.api.operators.apply_operator``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from populora_core.api.lora import LoraFactors, LoraWeights

from . import linalg as la


class ZeroDeltaWarning(UserWarning):
    """An operator met modules whose delta W is 0 (B = 0: untrained adapters) and left them as they are."""


# --- helpers ------------------------------------------------------------------------------------


def _is_zero(f: LoraFactors) -> bool:
    """B == 0 everywhere (aminmax: one vectorized pass, 5x faster than torch.any here)."""
    low, high = torch.aminmax(f.B)
    return float(low) == 0.0 and float(high) == 0.0


def _copy(f: LoraFactors) -> LoraFactors:
    return LoraFactors(f.A.clone(), f.B.clone(), f.scale)


def _refactored(
    u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor, like: LoraFactors, parent_as: list[torch.Tensor], params: Any
) -> LoraFactors:
    a_floor = params.a_floor * la.rms_row_norm(parent_as)
    a, b = la.refactor(u, s, vh, like.scale, like.A.shape[0], a_floor=a_floor, dtype=like.A.dtype)
    return LoraFactors(a, b.to(like.B.dtype), like.scale)


def _refactored_svd(f: la.FactoredSvd, like: LoraFactors, parent_as: list[torch.Tensor], params: Any) -> LoraFactors:
    """:func:`_refactored` of a factored SVD (one GEMM per block and side, no U or Vh copies)."""
    a_floor = params.a_floor * la.rms_row_norm(parent_as)
    a, b = la.refactor_factored(f, like.scale, like.A.shape[0], a_floor=a_floor, dtype=like.A.dtype)
    return LoraFactors(a, b.to(like.B.dtype), like.scale)


def randn(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian draws from ``generator`` on its own device, moved to ``device``: the same stream, so
    the same child, whichever device the parents live on."""
    return torch.randn(shape, generator=generator, device=generator.device).to(device)


def module_generators(generator: torch.Generator, count: int) -> list[torch.Generator]:
    """One generator per module, seeded from ``generator`` one draw at a time (module i's stream depends only
    on the draws before it), so modules can draw their noise on parallel threads: one CPU stream draws about
    180 M uniforms a second, the bulk of a noise mutation at 7B shapes."""
    seeds = [int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)) for _ in range(count)]
    return [torch.Generator(device=generator.device).manual_seed(seed) for seed in seeds]


def rand(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) draws, as :func:`randn`."""
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def _warn_zero_crossover(parents: list[LoraWeights], op: str) -> None:
    names = list(parents[0].modules)
    zero = [
        n for n, z in zip(names, la.parallel_map(lambda n: all(_is_zero(p.modules[n]) for p in parents), names)) if z
    ]
    if zero:
        warnings.warn(
            f"{op}: {len(zero)} of {len(parents[0].modules)} modules have B = 0 in every parent "
            "(untrained adapters): the child's delta W is 0 there too; mutate it (zero_delta=floor) "
            "or train the parents first",
            ZeroDeltaWarning,
            stacklevel=3,
        )
